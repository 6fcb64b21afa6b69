//! Who gets a slot, who gives one up, and when a quiet client is let go:
//! the policy, as pure functions of plain data.
//!
//! Why. Slots are bounded (`max_connections`) so that memory and threads
//! are, but a bound is something to hold hostage: 64 clients that connect
//! and then do nothing would keep everyone else out. So a slot is held
//! only while it is used, and a newcomer who finds the table full takes
//! the slot of a client that is not using its own ("bumps" it). Not using
//! a slot means one of three things, each the client's doing, never the
//! server's (a slow disk under load must not make a good client look
//! hostile):
//!
//! - negotiating for `HANDSHAKE_BUMP_MIN` or more: a real client finishes
//!   the handshake in a few round trips; one that took the greeting and
//!   went quiet is not a client yet;
//! - a reply that has waited `STUCK_BUMP_MIN` for the client to read it:
//!   its requests are "in flight" only because it does not take the answer
//!   (on a Unix socket 64 clients that each ask for 1 MiB and never read
//!   held every slot "busy" for the whole idle timeout);
//! - idle: nothing in flight and quiet for `STUCK_BUMP_MIN`.
//!
//! Among those, a negotiating one goes first (it was never admitted), then
//! a stuck one, then an idle one (a quiet client may be a VM whose disk
//! just has nothing to do); within a kind, the one useless the longest.
//! Only when no slot is bumpable is the newcomer turned away, and told why.
//!
//! Why pure. The order above is the whole defence against lock-outs, and
//! it is decided from a handful of numbers per slot; kept apart from the
//! sockets and atomics that feed it (`table.rs` takes a snapshot), every
//! case of it is a unit test below instead of a timing-dependent
//! end-to-end test. The same holds for the idle timeout's verdict (a
//! client waiting on its own slow replies is not idle) and for the rate
//! limit of the log line about refusals.

use std::time::Duration;

/// A connection still negotiating after this long may be bumped.
pub(super) const HANDSHAKE_BUMP_MIN: Duration = Duration::from_millis(500);
/// A connection idle, or whose reply has not moved, for this long may be
/// bumped.
pub(super) const STUCK_BUMP_MIN: Duration = Duration::from_secs(2);
/// Least time between two log lines about refused clients.
pub(super) const REFUSAL_LOG_INTERVAL_MS: u64 = 1000;

/// How a slot goes unused, in the order they are bumped.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum Unused {
    /// Took the greeting and did not finish the handshake.
    Negotiating,
    /// A reply waits for the client to read it.
    ReplyUnread,
    /// Nothing in flight, nothing sent.
    Idle,
}

/// What the policy needs to know of one slot, read at one moment. Times
/// are ms on the server's clock, except `reply_stuck_ms` (a duration).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum SlotState {
    /// Already being closed (bumped or reclaimed): never chosen again.
    Closing,
    /// In the handshake, since the client connected at `connected_ms`.
    Negotiating { connected_ms: u64 },
    /// Past the handshake.
    Transmitting {
        /// When the client last sent anything.
        last_active_ms: u64,
        /// Requests queued or being served.
        in_flight: usize,
        /// How long the reply piece being written has waited for the
        /// client (0: none is being written).
        reply_stuck_ms: u64,
    },
}

/// What to do with a newcomer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Admission {
    /// There is a free slot.
    Admit,
    /// Close the slot at this index (of the snapshot given) and admit.
    Bump {
        /// Index of the victim in the snapshot.
        victim: usize,
        /// Why it may be bumped.
        unused: Unused,
    },
    /// Every slot is used: turn the newcomer away.
    Refuse,
}

/// Why `slot` may be given to a newcomer, and since when (ms), if it may.
pub(super) fn unused_since(slot: &SlotState, now_ms: u64) -> Option<(Unused, u64)> {
    let stuck_min_ms = STUCK_BUMP_MIN.as_millis() as u64;
    match *slot {
        SlotState::Closing => None,
        SlotState::Negotiating { connected_ms } => {
            let negotiating_ms = now_ms.saturating_sub(connected_ms);
            (negotiating_ms >= HANDSHAKE_BUMP_MIN.as_millis() as u64)
                .then_some((Unused::Negotiating, connected_ms))
        }
        SlotState::Transmitting { reply_stuck_ms, .. } if reply_stuck_ms >= stuck_min_ms => {
            Some((Unused::ReplyUnread, now_ms.saturating_sub(reply_stuck_ms)))
        }
        SlotState::Transmitting {
            last_active_ms,
            in_flight,
            ..
        } => {
            let idle = in_flight == 0 && now_ms.saturating_sub(last_active_ms) >= stuck_min_ms;
            idle.then_some((Unused::Idle, last_active_ms))
        }
    }
}

/// The slot to bump among `slots` (see the module comment for the order):
/// its index and why, or `None` if every slot is used.
pub(super) fn choose_bump(slots: &[SlotState], now_ms: u64) -> Option<(usize, Unused)> {
    slots
        .iter()
        .enumerate()
        .filter_map(|(i, s)| unused_since(s, now_ms).map(|u| (i, u)))
        .min_by_key(|&(_, unused)| unused)
        .map(|(i, (unused, _))| (i, unused))
}

/// Whether a newcomer gets in, with `active_count` slots taken of
/// `max_connections` and `slots` the open ones now.
pub(super) fn admit(
    active_count: usize,
    max_connections: usize,
    slots: &[SlotState],
    now_ms: u64,
) -> Admission {
    assert!(max_connections > 0, "a server with no slot admits nobody");
    if active_count < max_connections {
        return Admission::Admit;
    }
    match choose_bump(slots, now_ms) {
        Some((victim, unused)) => Admission::Bump { victim, unused },
        None => Admission::Refuse,
    }
}

/// What to do when a client has sent nothing for the idle timeout.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Quiet {
    /// Nothing in flight: the client is idle; close it.
    Close,
    /// It waits for replies of its own: not idle; keep waiting.
    Keep,
}

/// The idle timeout's verdict on a client quiet that long with
/// `in_flight` requests of its own still being served.
pub(super) fn quiet_for_idle_timeout(in_flight: usize) -> Quiet {
    if in_flight == 0 {
        Quiet::Close
    } else {
        Quiet::Keep
    }
}

/// Whether the refusals not yet logged (`unlogged`) are logged now: at
/// most one line per `REFUSAL_LOG_INTERVAL_MS` (`last_logged_ms` 0: never
/// logged).
pub(super) fn refusal_log_due(unlogged: u64, last_logged_ms: u64, now_ms: u64) -> bool {
    unlogged > 0 && (last_logged_ms == 0 || now_ms >= last_logged_ms + REFUSAL_LOG_INTERVAL_MS)
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW_MS: u64 = 100_000;

    /// A slot in transmission: quiet for `quiet_ms`, `in_flight`
    /// requests, a reply waiting `stuck_ms` for the client.
    fn transmitting(quiet_ms: u64, in_flight: usize, stuck_ms: u64) -> SlotState {
        SlotState::Transmitting {
            last_active_ms: NOW_MS - quiet_ms,
            in_flight,
            reply_stuck_ms: stuck_ms,
        }
    }

    /// Busy just now.
    fn busy() -> SlotState {
        transmitting(10, 1, 0)
    }

    fn negotiating_for(ms: u64) -> SlotState {
        SlotState::Negotiating {
            connected_ms: NOW_MS - ms,
        }
    }

    fn reply_unread_for(ms: u64) -> SlotState {
        transmitting(10, 1, ms)
    }

    fn idle_for(ms: u64) -> SlotState {
        transmitting(ms, 0, 0)
    }

    #[test]
    fn a_free_slot_admits_whatever_the_others_do() {
        let slots = [busy(), negotiating_for(5000)];
        assert_eq!(admit(2, 3, &slots, NOW_MS), Admission::Admit);
        assert_eq!(admit(0, 1, &[], NOW_MS), Admission::Admit);
    }

    #[test]
    fn each_kind_is_bumpable_only_past_its_threshold() {
        let cases = [
            (negotiating_for(499), None),
            (negotiating_for(500), Some(Unused::Negotiating)),
            (reply_unread_for(1999), None),
            (reply_unread_for(2000), Some(Unused::ReplyUnread)),
            (idle_for(1999), None),
            (idle_for(2000), Some(Unused::Idle)),
            (busy(), None),
        ];
        for (slot, want) in cases {
            assert_eq!(
                unused_since(&slot, NOW_MS).map(|(u, _)| u),
                want,
                "{slot:?}"
            );
        }
    }

    #[test]
    fn quiet_but_waiting_on_its_own_requests_is_not_idle() {
        let waiting = transmitting(60_000, 3, 0);
        assert_eq!(unused_since(&waiting, NOW_MS), None);
        assert_eq!(admit(1, 1, &[waiting], NOW_MS), Admission::Refuse);
    }

    #[test]
    fn negotiating_goes_before_reply_unread_before_idle() {
        let slots = [
            idle_for(60_000),
            reply_unread_for(30_000),
            negotiating_for(600),
        ];
        assert_eq!(
            admit(3, 3, &slots, NOW_MS),
            Admission::Bump {
                victim: 2,
                unused: Unused::Negotiating
            }
        );
        assert_eq!(
            admit(2, 2, &slots[..2], NOW_MS),
            Admission::Bump {
                victim: 1,
                unused: Unused::ReplyUnread
            }
        );
        assert_eq!(
            admit(1, 1, &slots[..1], NOW_MS),
            Admission::Bump {
                victim: 0,
                unused: Unused::Idle
            }
        );
    }

    #[test]
    fn within_a_kind_the_one_unused_longest_goes() {
        let slots = [idle_for(3000), idle_for(9000), idle_for(5000)];
        assert_eq!(choose_bump(&slots, NOW_MS), Some((1, Unused::Idle)));
        let slots = [reply_unread_for(2500), reply_unread_for(7000)];
        assert_eq!(choose_bump(&slots, NOW_MS), Some((1, Unused::ReplyUnread)));
        let slots = [negotiating_for(800), negotiating_for(4000)];
        assert_eq!(choose_bump(&slots, NOW_MS), Some((1, Unused::Negotiating)));
    }

    #[test]
    fn a_slot_already_closing_is_never_chosen_again() {
        let closing = SlotState::Closing;
        assert_eq!(admit(1, 1, &[closing], NOW_MS), Admission::Refuse);
        assert_eq!(
            choose_bump(&[closing, idle_for(2500)], NOW_MS),
            Some((1, Unused::Idle))
        );
    }

    #[test]
    fn every_slot_used_refuses() {
        let slots = [
            busy(),
            negotiating_for(100),
            reply_unread_for(500),
            idle_for(1000),
        ];
        assert_eq!(admit(4, 4, &slots, NOW_MS), Admission::Refuse);
    }

    #[test]
    fn the_idle_timeout_closes_only_clients_with_nothing_in_flight() {
        assert_eq!(quiet_for_idle_timeout(0), Quiet::Close);
        assert_eq!(quiet_for_idle_timeout(1), Quiet::Keep);
    }

    #[test]
    fn refusals_are_logged_at_most_once_a_second() {
        assert!(!refusal_log_due(0, 0, NOW_MS), "nothing to log");
        assert!(refusal_log_due(1, 0, 5), "the first one at once");
        assert!(!refusal_log_due(3, NOW_MS, NOW_MS + 999));
        assert!(refusal_log_due(3, NOW_MS, NOW_MS + 1000));
    }
}
