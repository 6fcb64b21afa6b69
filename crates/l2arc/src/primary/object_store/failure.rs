//! What a failed request says, in one line that keeps its cause.
//!
//! Why a module of its own: the person who reads the message is one who
//! must act on it (a mistyped key, a wrong endpoint, a bucket in another
//! account, a server that does not answer), and each of those needs a
//! different act. OpenDAL's own text is built for a debugger: the request
//! context (URL, headers) first and the cause last, after a `source:` the
//! old code cut at 200 characters ("... sourc"). Here the cause comes
//! first and whole: the store's S3 error code and message when it sent one,
//! else the HTTP status of an answer that was not S3 at all, else the root
//! of the transport error ("Connection refused (os error 111)") with the
//! endpoint it was trying, else the missing credentials named as the AWS
//! tools name them.
//!
//! The same classification decides what the rest of the back end does
//! with a failure: whether the store answered (it is reachable, whatever
//! it said: no outage, see `health`), and whether the failure says anything
//! about the object (a 404, a 412) or only about the store's state now (a
//! timeout, a refused connection, a 5xx, throttling), which is what
//! `stale_if_error` may paper over.

use std::io;

/// Why a request failed, as far as the reader must know.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Cause {
    /// The store answered with this S3 error code.
    Code(String),
    /// An HTTP answer with no S3 error in it (a web server, a proxy's page).
    NotS3 {
        /// The HTTP status.
        status: u16,
    },
    /// No answer: the request timed out, or its connection was refused,
    /// reset or cut.
    NoAnswer,
    /// No credentials were found to sign the request with.
    NoCredentials,
    /// Anything else (an answer OpenDAL could not use, a bad option).
    Other,
}

/// A failed request or sequence of tries, with what it means.
#[derive(Debug)]
pub(super) struct Failure {
    pub(super) kind: io::ErrorKind,
    pub(super) cause: Cause,
    /// One line, the cause first; no credentials, no request headers.
    pub(super) detail: String,
    /// The server sent an HTTP answer (it is reachable).
    pub(super) answered: bool,
    /// The failure says nothing about the object, only about the store
    /// now: a timeout, no connection, a 5xx, throttling.
    pub(super) transient: bool,
}

impl Failure {
    /// The failure as the `io::Error` the read path and front ends see:
    /// `what` (the request: "read KEY [a, b)") then the detail.
    pub(super) fn into_io(self, what: &str) -> io::Error {
        io::Error::new(self.kind, format!("{what}: {}", self.detail))
    }

    /// No answer within the time a request or a read may take.
    pub(super) fn timed_out(detail: String) -> Self {
        Self {
            kind: io::ErrorKind::TimedOut,
            cause: Cause::NoAnswer,
            detail,
            answered: false,
            transient: true,
        }
    }
}

/// The value of `field: "..."` in OpenDAL's debug text of an S3 error body
/// (`S3Error { code: "NoSuchBucket", message: "...", ... }`), unescaped.
fn quoted(text: &str, field: &str) -> Option<String> {
    let start = text.find(&format!("{field}: \""))? + field.len() + 3;
    let mut out = String::new();
    let mut chars = text[start..].chars();
    while let Some(c) = chars.next() {
        match c {
            '"' => return Some(out),
            '\\' => out.push(chars.next()?),
            c => out.push(c),
        }
    }
    None
}

/// The HTTP status of the answer OpenDAL kept in the error's context
/// (`response: Parts { status: 404, ...`), if the server answered.
fn status_of(text: &str) -> Option<u16> {
    let at = text.find("response: Parts { status: ")? + "response: Parts { status: ".len();
    let digits: String = text[at..]
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    digits.parse().ok()
}

/// "scheme://host:port" of the URL the request went to, from the error's
/// context (`url: http://127.0.0.1:1/bkt?list-type=2...`): where the
/// transport failed, without the path and query.
fn endpoint_of(text: &str) -> Option<String> {
    let at = text.find("url: ")? + "url: ".len();
    let url = &text[at..];
    let scheme_end = url.find("://")? + 3;
    let host_end = url[scheme_end..]
        .find(['/', ',', ' ', '?'])
        .map_or(url.len(), |i| scheme_end + i);
    Some(url[..host_end].to_string())
}

/// The innermost error of `e`'s source chain and the first `io::Error`
/// kind met along it (a refused or reset connection).
fn root_of(e: &opendal::Error) -> (Option<String>, Option<io::ErrorKind>) {
    let mut source = std::error::Error::source(e);
    let mut root = None;
    let mut io_kind = None;
    while let Some(s) = source {
        if io_kind.is_none()
            && let Some(io) = s.downcast_ref::<io::Error>()
        {
            io_kind = Some(io.kind());
        }
        root = Some(s.to_string());
        source = s.source();
    }
    (root, io_kind)
}

/// The first line of `text`, whole (a multi-line body is never cut
/// mid-word: its first line is kept entire, the rest dropped).
fn first_line(text: &str) -> &str {
    text.lines()
        .map(str::trim)
        .find(|l| !l.is_empty())
        .unwrap_or("")
}

/// Where the AWS tools look for credentials, as the message names them.
pub(super) const CREDENTIALS_HINT: &str = "no credentials found: set AWS_ACCESS_KEY_ID and \
    AWS_SECRET_ACCESS_KEY, or AWS_PROFILE naming a profile of ~/.aws/credentials or \
    ~/.aws/config (the [default] profile when AWS_PROFILE is unset)";

/// Classifies an OpenDAL error (see the module comment).
pub(super) fn failure_of(e: &opendal::Error) -> Failure {
    let text = e.to_string();
    let status = status_of(&text);
    let code = quoted(e.message(), "code").filter(|c| !c.is_empty());
    let throttled = e.kind() == opendal::ErrorKind::RateLimited
        || status.is_some_and(|s| s == 429 || (500..600).contains(&s))
        || code.as_deref() == Some("SlowDown");
    match (code, status) {
        (Some(code), _) => from_code(e, code, status.is_some(), throttled),
        (None, Some(status)) => from_status(e, &text, status, throttled),
        (None, None) if text.contains("credential") && !e.is_temporary() => Failure {
            kind: io::ErrorKind::PermissionDenied,
            cause: Cause::NoCredentials,
            detail: CREDENTIALS_HINT.to_string(),
            answered: false,
            transient: false,
        },
        (None, None) if e.is_temporary() => from_transport(e, &text),
        (None, None) => other(e),
    }
}

/// An answer with an S3 error code.
fn from_code(e: &opendal::Error, code: String, answered: bool, throttled: bool) -> Failure {
    use opendal::ErrorKind as K;
    let message = quoted(e.message(), "message").unwrap_or_default();
    let kind = match (e.kind(), code.as_str()) {
        (_, "NoSuchBucket" | "NoSuchKey") => io::ErrorKind::NotFound,
        // XAdminUserNotFound: versitygw's answer (a 404) to an access key
        // it does not know, where S3 says InvalidAccessKeyId (403).
        (
            _,
            "AccessDenied" | "InvalidAccessKeyId" | "SignatureDoesNotMatch" | "XAdminUserNotFound",
        ) => io::ErrorKind::PermissionDenied,
        (K::ConditionNotMatch, _) => io::ErrorKind::StaleNetworkFileHandle,
        (K::RateLimited, _) | (_, "SlowDown") => io::ErrorKind::ResourceBusy,
        (K::NotFound, _) => io::ErrorKind::NotFound,
        (K::PermissionDenied, _) => io::ErrorKind::PermissionDenied,
        _ => io::ErrorKind::Other,
    };
    let detail = if message.is_empty() {
        code.clone()
    } else {
        format!("{code}: {}", first_line(&message))
    };
    Failure {
        kind,
        cause: Cause::Code(code),
        detail,
        answered,
        transient: throttled,
    }
}

/// An answer with no S3 error body: S3 answers HEAD without a body (404:
/// no such key, 412: changed); anything else of S3 sends XML.
fn from_status(e: &opendal::Error, text: &str, status: u16, throttled: bool) -> Failure {
    use opendal::ErrorKind as K;
    let kind = match e.kind() {
        K::NotFound => io::ErrorKind::NotFound,
        K::PermissionDenied => io::ErrorKind::PermissionDenied,
        K::ConditionNotMatch => io::ErrorKind::StaleNetworkFileHandle,
        K::RateLimited => io::ErrorKind::ResourceBusy,
        _ => io::ErrorKind::Other,
    };
    // OpenDAL's XML reader takes some pages for an S3 error with every
    // field empty: that is no S3 error either.
    let body = Some(first_line(e.message())).filter(|b| !b.starts_with("S3Error {"));
    let body = body.unwrap_or("");
    let html = body.starts_with('<')
        || text
            .to_ascii_lowercase()
            .contains("\"content-type\": \"text/html");
    let detail = if html {
        format!("HTTP {status} with an HTML page, not an S3 error")
    } else if body.is_empty() {
        format!("HTTP {status} without an S3 error")
    } else {
        format!("HTTP {status}: {body}")
    };
    Failure {
        kind,
        cause: Cause::NotS3 { status },
        detail,
        answered: true,
        transient: throttled,
    }
}

/// No answer: the transport failed. Its root cause, whole, and where it
/// was going.
fn from_transport(e: &opendal::Error, text: &str) -> Failure {
    let (root, io_kind) = root_of(e);
    let cause = root.unwrap_or_else(|| first_line(e.message()).to_string());
    let detail = match endpoint_of(text) {
        Some(endpoint) => format!("cannot reach {endpoint}: {cause}"),
        None => format!("cannot reach the store: {cause}"),
    };
    let kind = match io_kind {
        Some(
            k @ (io::ErrorKind::ConnectionRefused
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::TimedOut),
        ) => k,
        _ => io::ErrorKind::Other,
    };
    Failure {
        kind,
        cause: Cause::NoAnswer,
        detail,
        answered: false,
        transient: true,
    }
}

/// Anything else: a bad option, an answer OpenDAL could not use.
fn other(e: &opendal::Error) -> Failure {
    use opendal::ErrorKind as K;
    let kind = match e.kind() {
        K::NotFound => io::ErrorKind::NotFound,
        K::PermissionDenied => io::ErrorKind::PermissionDenied,
        K::ConditionNotMatch => io::ErrorKind::StaleNetworkFileHandle,
        K::ConfigInvalid => io::ErrorKind::InvalidInput,
        K::IsADirectory => io::ErrorKind::IsADirectory,
        K::NotADirectory => io::ErrorKind::NotADirectory,
        _ => io::ErrorKind::Other,
    };
    let message = first_line(e.message());
    let detail = match root_of(e).0 {
        Some(root) if !message.is_empty() => format!("{message}: {root}"),
        Some(root) => root,
        None if !message.is_empty() => message.to_string(),
        None => e.kind().to_string(),
    };
    Failure {
        kind,
        cause: Cause::Other,
        detail,
        answered: false,
        transient: false,
    }
}

/// What to do about a failed start-up check, by cause: one hint that
/// names the setting to look at.
pub(super) fn check_hint(failure: &Failure) -> &'static str {
    match &failure.cause {
        Cause::Code(code) => match code.as_str() {
            "NoSuchBucket" => " (no such bucket: check its name, and the endpoint and region)",
            "InvalidAccessKeyId" | "XAdminUserNotFound" => {
                " (the access key is not known to the server: check AWS_ACCESS_KEY_ID or the \
                 profile's aws_access_key_id)"
            }
            "SignatureDoesNotMatch" => {
                " (the secret key does not go with the access key: check \
                 AWS_SECRET_ACCESS_KEY or the profile's aws_secret_access_key)"
            }
            "AccessDenied" => " (credentials refused: the key may not list this bucket)",
            _ => "",
        },
        Cause::NotS3 { .. } => " (not an S3 server? check --s3-endpoint)",
        Cause::NoAnswer => " (check --s3-endpoint, AWS_ENDPOINT_URL or the profile's endpoint_url)",
        Cause::NoCredentials | Cause::Other => "",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_of_opendal_text_are_found_whole() {
        let body = r#"S3Error { code: "NoSuchBucket", message: "The \"b\" bucket does not exist.", resource: "" }"#;
        assert_eq!(quoted(body, "code").as_deref(), Some("NoSuchBucket"));
        assert_eq!(
            quoted(body, "message").as_deref(),
            Some("The \"b\" bucket does not exist.")
        );
        let text = "Unexpected (permanent) at list, context: { uri: http://h/b, response: Parts { status: 404, version: HTTP/1.1 } }";
        assert_eq!(status_of(text), Some(404));
        assert_eq!(status_of("Unexpected at list"), None);
        let text = "Unexpected (temporary) at list, context: { url: http://127.0.0.1:9/bkt?list-type=2&delimiter=/, called: reqwest::send }";
        assert_eq!(endpoint_of(text).as_deref(), Some("http://127.0.0.1:9"));
        assert_eq!(first_line("\n  <html>\n<body>"), "<html>");
    }
}
