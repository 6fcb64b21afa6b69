//! What each request is charged against the buffer budget, and whom to
//! disconnect when the budget is held hostage: the policy of back-pressure,
//! as pure functions of plain data.
//!
//! Why charges are decided up front. Every byte a request makes the server
//! hold (a write's payload until it is written, a read's reply until the
//! client takes it) is charged to the shared pool (`pool.rs`) before it is
//! allocated; a charge that cannot be granted makes the reader stop
//! reading its socket, and TCP pushes back on that client only. So the
//! size of each charge is the server's memory bound, and it must never
//! depend on what the client says it will send: a read of one buffer is
//! charged its reply (header and data), anything larger is served by
//! splitting and charged one piece (`SPLIT_CHUNK_BYTES`, never more than
//! the advertised maximum payload), whatever its length.
//!
//! Why reclaiming picks the largest stalled holder. A full pool is freed
//! by disconnecting one connection whose *client* keeps its memory from
//! coming back (`pool::Account::is_stalled`); among those, the one that
//! holds the most frees the most with one disconnect. The connection that
//! asks is never its own victim, and one already closing is not chosen
//! twice (its memory is on its way back).

use super::{SPLIT_CHUNK_BYTES, ServerConfig};
use crate::protocol::{Command, SIMPLE_REPLY_BYTES};

/// The largest read served from one buffer: the advertised maximum
/// payload; longer reads go out in pieces of [`split_piece_bytes`].
pub(super) fn read_piece_bytes(config: &ServerConfig) -> u32 {
    config.max_payload_bytes
}

/// The piece size of a request served by splitting: `SPLIT_CHUNK_BYTES`,
/// never more than the advertised maximum payload.
pub(super) fn split_piece_bytes(config: &ServerConfig) -> u32 {
    SPLIT_CHUNK_BYTES.min(config.max_payload_bytes)
}

/// Bytes charged for a checked request that was not charged at its header
/// (every command but a write with data): a read of one buffer, its whole
/// reply; a longer read, one piece; anything else, its payload.
pub(super) fn request_charge_bytes(
    command: Command,
    length_bytes: u32,
    payload_bytes: usize,
    read_piece_bytes: u32,
    split_piece_bytes: u32,
) -> u64 {
    match command {
        Command::Read if length_bytes > read_piece_bytes => u64::from(split_piece_bytes),
        Command::Read => u64::from(length_bytes) + SIMPLE_REPLY_BYTES as u64,
        _ => payload_bytes as u64,
    }
}

/// How a write's payload is taken, decided at its header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum WritePlan {
    /// Whole, in one buffer charged `charge_bytes`.
    Buffer {
        /// The payload's length.
        charge_bytes: u64,
    },
    /// Over the maximum payload: in pieces, one held (and charged) at a
    /// time, written by the reader before it reads on.
    Split {
        /// The piece size, also the charge.
        piece_bytes: u32,
    },
}

/// The plan for a write of `length_bytes` under `max_payload_bytes`, with
/// pieces of `split_piece_bytes` if it is split.
pub(super) fn write_plan(
    length_bytes: u32,
    max_payload_bytes: u32,
    split_piece_bytes: u32,
) -> WritePlan {
    assert!(split_piece_bytes > 0 && split_piece_bytes <= max_payload_bytes);
    if length_bytes <= max_payload_bytes {
        WritePlan::Buffer {
            charge_bytes: u64::from(length_bytes),
        }
    } else {
        WritePlan::Split {
            piece_bytes: split_piece_bytes,
        }
    }
}

/// What reclaiming needs to know of one connection's pool account.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct HolderState {
    /// The connection whose charge is waiting (never its own victim).
    pub(super) asking: bool,
    /// Already being closed.
    pub(super) closing: bool,
    /// Its client keeps its memory from coming back.
    pub(super) stalled: bool,
    /// Pool memory it holds.
    pub(super) held_bytes: u64,
}

/// The connection to disconnect so that a waiting charge may go: the
/// stalled one holding the most, if any.
pub(super) fn reclaim_victim(holders: &[HolderState]) -> Option<usize> {
    holders
        .iter()
        .enumerate()
        .filter(|(_, h)| !h.asking && !h.closing && h.stalled)
        .max_by_key(|(_, h)| h.held_bytes)
        .map(|(i, _)| i)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u32 = 1 << 20;

    #[test]
    fn a_read_of_one_buffer_is_charged_its_whole_reply_and_a_longer_one_a_piece() {
        let (piece, split) = (32 * MIB, 4 * MIB);
        let charge = |len| request_charge_bytes(Command::Read, len, 0, piece, split);
        assert_eq!(charge(4096), 4096 + SIMPLE_REPLY_BYTES as u64);
        assert_eq!(charge(piece), u64::from(piece) + SIMPLE_REPLY_BYTES as u64);
        assert_eq!(charge(piece + 1), u64::from(split));
        assert_eq!(
            charge(u32::MAX),
            u64::from(split),
            "never what the client asks"
        );
    }

    #[test]
    fn other_commands_are_charged_their_payload_only() {
        for command in [
            Command::Flush,
            Command::Trim,
            Command::WriteZeroes,
            Command::Cache,
        ] {
            assert_eq!(request_charge_bytes(command, 1 << 30, 0, MIB, MIB), 0);
        }
        assert_eq!(request_charge_bytes(Command::Write, 0, 0, MIB, MIB), 0);
    }

    #[test]
    fn the_split_piece_never_exceeds_the_advertised_maximum() {
        for (max_payload_bytes, want) in [(32 * MIB, SPLIT_CHUNK_BYTES), (MIB, MIB), (4096, 4096)] {
            let config = ServerConfig {
                max_payload_bytes,
                ..ServerConfig::default()
            };
            assert_eq!(split_piece_bytes(&config), want);
            assert_eq!(read_piece_bytes(&config), max_payload_bytes);
        }
    }

    #[test]
    fn writes_up_to_the_maximum_are_buffered_and_longer_ones_split() {
        assert_eq!(
            write_plan(MIB, MIB, MIB / 4),
            WritePlan::Buffer {
                charge_bytes: u64::from(MIB)
            }
        );
        assert_eq!(
            write_plan(0, MIB, MIB / 4),
            WritePlan::Buffer { charge_bytes: 0 }
        );
        assert_eq!(
            write_plan(MIB + 1, MIB, MIB / 4),
            WritePlan::Split {
                piece_bytes: MIB / 4
            }
        );
        assert_eq!(
            write_plan(u32::MAX, MIB, MIB),
            WritePlan::Split { piece_bytes: MIB }
        );
    }

    fn holder(held_bytes: u64) -> HolderState {
        HolderState {
            asking: false,
            closing: false,
            stalled: true,
            held_bytes,
        }
    }

    #[test]
    fn reclaim_takes_the_largest_stalled_holder() {
        let holders = [holder(10), holder(300), holder(20)];
        assert_eq!(reclaim_victim(&holders), Some(1));
    }

    #[test]
    fn reclaim_spares_the_asker_the_closing_and_the_clients_that_read() {
        let holders = [
            HolderState {
                asking: true,
                ..holder(900)
            },
            HolderState {
                closing: true,
                ..holder(800)
            },
            HolderState {
                stalled: false,
                ..holder(700)
            },
            holder(5),
        ];
        assert_eq!(reclaim_victim(&holders), Some(3));
        assert_eq!(reclaim_victim(&holders[..3]), None);
        assert_eq!(reclaim_victim(&[]), None);
    }
}
