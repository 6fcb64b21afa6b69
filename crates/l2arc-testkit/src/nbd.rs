//! What the NBD tests share: the one NBD client of the test suites and
//! the soak (built from `l2arc_nbd::protocol`'s encoders, decoders and
//! constants, so that a change of the wire format is made once), a loop
//! device for the block-device cases, and the deterministic bytes images
//! are filled with. Starting `l2arc serve-nbd` itself is `crate::service`.
//!
//! Why one client. Each test file used to carry its own: a dozen copies of
//! the handshake, two of them with the protocol's constants typed again.
//! This one reads every reply through the protocol module's decoders, so a
//! server that answers with a bad magic, a wrong cookie or a refusal fails
//! the test with that said, whichever test it is. Tests that send
//! malformed bytes on purpose write them raw on [`NbdClient::stream`] and
//! take the well-formed parts from here.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use l2arc_nbd::protocol::{
    self, EXPORT_NAME_REPLY_BYTES, GREETING_BYTES, NBD_CMD_DISC, NBD_CMD_READ,
    NBD_FLAG_C_FIXED_NEWSTYLE, NBD_FLAG_C_NO_ZEROES, NBD_FLAG_FIXED_NEWSTYLE, NBD_INFO_BLOCK_SIZE,
    NBD_OPT_EXPORT_NAME, NBD_OPT_GO, NBD_REP_ACK, NBD_REP_INFO, OPTION_REPLY_HEADER_BYTES,
    OptionReplyHeader, ProtocolError, REQUEST_BYTES, Request, SIMPLE_REPLY_BYTES, SimpleReply,
};

/// Deterministic, incompressible-looking bytes (xorshift), different per
/// seed.
pub fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut v = Vec::with_capacity(len + 8);
    while v.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        v.extend_from_slice(&x.to_le_bytes());
    }
    v.truncate(len);
    v
}

/// Read and write timeout of a new client.
pub const CLIENT_TIMEOUT: Duration = Duration::from_secs(20);

/// Why an NBD exchange failed.
#[derive(Debug)]
pub enum NbdError {
    /// The socket failed or closed.
    Io(std::io::Error),
    /// The server broke the protocol (a bad magic).
    Protocol(ProtocolError),
    /// An option was refused: its `NBD_REP_ERR_*` and the server's message.
    Refused {
        /// The error reply's type.
        reply_type: u32,
        /// What the server said.
        message: String,
    },
    /// A request was answered with this `NBD_E*` errno.
    Errno(u32),
    /// A reply to another request than the one awaited.
    Cookie {
        /// The cookie awaited.
        want: u64,
        /// The cookie that came.
        got: u64,
    },
}

impl NbdError {
    /// The errno a request was answered with, if that is the failure.
    pub fn errno(&self) -> Option<u32> {
        match self {
            NbdError::Errno(e) => Some(*e),
            _ => None,
        }
    }

    /// The option reply type of a refusal, if that is the failure.
    pub fn refusal(&self) -> Option<u32> {
        match self {
            NbdError::Refused { reply_type, .. } => Some(*reply_type),
            _ => None,
        }
    }
}

impl std::fmt::Display for NbdError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NbdError::Io(e) => write!(f, "{e}"),
            NbdError::Protocol(e) => write!(f, "protocol: {e}"),
            NbdError::Refused {
                reply_type,
                message,
            } => write!(f, "refused ({reply_type:#x}): {message}"),
            NbdError::Errno(e) => write!(f, "errno {e}"),
            NbdError::Cookie { want, got } => write!(f, "reply to cookie {got}, not {want}"),
        }
    }
}

impl std::error::Error for NbdError {}

impl From<std::io::Error> for NbdError {
    fn from(e: std::io::Error) -> Self {
        NbdError::Io(e)
    }
}

impl From<ProtocolError> for NbdError {
    fn from(e: ProtocolError) -> Self {
        NbdError::Protocol(e)
    }
}

/// What the server said of its export at the end of the handshake.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Export {
    /// The export's size.
    pub size_bytes: u64,
    /// `NBD_FLAG_*` transmission flags.
    pub transmission_flags: u16,
}

/// An NBD client over a Unix socket, one step of the protocol per method.
/// Requests sent with [`Self::read`] and [`Self::command`] carry cookies
/// of their own and wait for their reply; [`Self::send`] and
/// [`Self::reply`] pipeline.
pub struct NbdClient {
    stream: UnixStream,
    next_cookie: u64,
}

impl NbdClient {
    /// Connects and takes the greeting (checked); sends nothing. Reads and
    /// writes time out after [`CLIENT_TIMEOUT`].
    pub fn greeted(socket: &Path) -> Result<NbdClient, NbdError> {
        let stream = UnixStream::connect(socket)?;
        let mut client = NbdClient {
            stream,
            next_cookie: 1 << 32,
        };
        client.set_timeout(Some(CLIENT_TIMEOUT))?;
        let mut greeting = [0u8; GREETING_BYTES];
        client.stream.read_exact(&mut greeting)?;
        let flags = protocol::decode_greeting(&greeting)?;
        assert_ne!(
            flags & NBD_FLAG_FIXED_NEWSTYLE,
            0,
            "a fixed newstyle server"
        );
        Ok(client)
    }

    /// [`Self::greeted`], then the client flags (fixed newstyle, no
    /// zeroes): ready for options.
    pub fn connect(socket: &Path) -> Result<NbdClient, NbdError> {
        let mut client = NbdClient::greeted(socket)?;
        client.send_client_flags(NBD_FLAG_C_FIXED_NEWSTYLE | NBD_FLAG_C_NO_ZEROES)?;
        Ok(client)
    }

    /// [`Self::connect`], then `NBD_OPT_GO` of the default export: in
    /// transmission. A refusal is [`NbdError::Refused`].
    pub fn open(socket: &Path) -> Result<NbdClient, NbdError> {
        let mut client = NbdClient::connect(socket)?;
        client.go("")?;
        Ok(client)
    }

    /// The socket, for bytes the protocol would not send (a test's garbage).
    pub fn stream(&mut self) -> &mut UnixStream {
        &mut self.stream
    }

    /// A second handle on the same connection (a writer thread's).
    pub fn try_clone(&self) -> std::io::Result<NbdClient> {
        Ok(NbdClient {
            stream: self.stream.try_clone()?,
            next_cookie: self.next_cookie + (1 << 31),
        })
    }

    /// Sets the read and write timeouts (`None`: wait for ever).
    pub fn set_timeout(&self, timeout: Option<Duration>) -> std::io::Result<()> {
        self.stream.set_read_timeout(timeout)?;
        self.stream.set_write_timeout(timeout)
    }

    /// Shuts the connection down both ways (a blocked write returns).
    pub fn shutdown(&self) {
        let _ = self.stream.shutdown(std::net::Shutdown::Both);
    }

    /// Sends the client flags that follow the greeting.
    pub fn send_client_flags(&mut self, flags: u32) -> std::io::Result<()> {
        self.stream.write_all(&flags.to_be_bytes())
    }

    /// Sends one option with its data.
    pub fn send_option(&mut self, option: u32, data: &[u8]) -> std::io::Result<()> {
        let mut bytes = Vec::new();
        protocol::encode_option(&mut bytes, option, data);
        self.stream.write_all(&bytes)
    }

    /// Reads one option reply to `option`: its type and data.
    pub fn option_reply(&mut self, option: u32) -> Result<(u32, Vec<u8>), NbdError> {
        let mut header = [0u8; OPTION_REPLY_HEADER_BYTES];
        self.stream.read_exact(&mut header)?;
        let header = OptionReplyHeader::decode(&header)?;
        assert_eq!(header.option, option, "a reply to another option");
        let mut data = vec![0u8; header.length_bytes as usize];
        self.stream.read_exact(&mut data)?;
        Ok((header.reply_type, data))
    }

    /// `NBD_OPT_GO` of export `name`: in transmission, with what the
    /// server said of the export; a refusal is [`NbdError::Refused`].
    pub fn go(&mut self, name: &str) -> Result<Export, NbdError> {
        let mut data = Vec::new();
        protocol::encode_info_request(&mut data, name, &[NBD_INFO_BLOCK_SIZE]);
        self.send_option(NBD_OPT_GO, &data)?;
        let mut export = None;
        loop {
            let (reply_type, data) = self.option_reply(NBD_OPT_GO)?;
            match reply_type {
                NBD_REP_INFO => {
                    if let Some((size_bytes, transmission_flags)) =
                        protocol::decode_info_export(&data)
                    {
                        export = Some(Export {
                            size_bytes,
                            transmission_flags,
                        });
                    }
                }
                NBD_REP_ACK => return Ok(export.expect("NBD_INFO_EXPORT before the ACK")),
                _ => {
                    return Err(NbdError::Refused {
                        reply_type,
                        message: String::from_utf8_lossy(&data).into_owned(),
                    });
                }
            }
        }
    }

    /// `NBD_OPT_EXPORT_NAME` of `name` (the old way in, no reply but the
    /// export's data; the server ends the session on an unknown name).
    pub fn export_name(&mut self, name: &str) -> Result<Export, NbdError> {
        self.send_option(NBD_OPT_EXPORT_NAME, name.as_bytes())?;
        let mut data = [0u8; EXPORT_NAME_REPLY_BYTES];
        self.stream.read_exact(&mut data)?;
        let (size_bytes, transmission_flags) = protocol::decode_export_name_reply(&data);
        Ok(Export {
            size_bytes,
            transmission_flags,
        })
    }

    /// Sends one request header and `payload` (which a hostile test may
    /// make shorter than `length_bytes`), without waiting for the reply.
    pub fn send(
        &mut self,
        command: u16,
        flags: u16,
        cookie: u64,
        offset_bytes: u64,
        length_bytes: u32,
        payload: &[u8],
    ) -> std::io::Result<()> {
        let request = Request {
            flags,
            command,
            cookie,
            offset_bytes,
            length_bytes,
        };
        let mut bytes = Vec::with_capacity(REQUEST_BYTES + payload.len());
        bytes.extend_from_slice(&request.encode());
        bytes.extend_from_slice(payload);
        self.stream.write_all(&bytes)
    }

    /// Reads one reply header (a read's data follows it if `error` is 0).
    pub fn reply(&mut self) -> Result<SimpleReply, NbdError> {
        let mut header = [0u8; SIMPLE_REPLY_BYTES];
        self.stream.read_exact(&mut header)?;
        Ok(protocol::decode_simple_reply(&header)?)
    }

    /// Reads `buf.len()` bytes of a read's reply data.
    pub fn read_data(&mut self, buf: &mut [u8]) -> std::io::Result<()> {
        self.stream.read_exact(buf)
    }

    /// Sends one request (a write carries `payload`) and waits for its
    /// reply, checking its cookie (no other may be in flight): `Ok` if it
    /// succeeded (a read's data follows: [`Self::read_data`]), or the errno.
    pub fn command(
        &mut self,
        command: u16,
        flags: u16,
        offset_bytes: u64,
        length_bytes: u32,
        payload: &[u8],
    ) -> Result<(), NbdError> {
        let cookie = self.next_cookie;
        self.next_cookie += 1;
        self.send(command, flags, cookie, offset_bytes, length_bytes, payload)?;
        let reply = self.reply()?;
        if reply.cookie != cookie {
            return Err(NbdError::Cookie {
                want: cookie,
                got: reply.cookie,
            });
        }
        match reply.error {
            0 => Ok(()),
            errno => Err(NbdError::Errno(errno)),
        }
    }

    /// Reads `length_bytes` at `offset_bytes`.
    pub fn read(&mut self, offset_bytes: u64, length_bytes: u32) -> Result<Vec<u8>, NbdError> {
        self.command(NBD_CMD_READ, 0, offset_bytes, length_bytes, &[])?;
        let mut data = vec![0u8; length_bytes as usize];
        self.read_data(&mut data)?;
        Ok(data)
    }

    /// Sends `NBD_CMD_DISC` (no reply comes; the server closes).
    pub fn disconnect(&mut self) -> std::io::Result<()> {
        self.send(NBD_CMD_DISC, 0, 0, 0, 0, &[])
    }

    /// True if the server closed the connection (waits up to the read
    /// timeout for the close; a byte that comes instead is false).
    pub fn closed(&mut self) -> bool {
        let mut b = [0u8; 1];
        matches!(self.stream.read(&mut b), Ok(0) | Err(_))
    }

    /// True if the server has closed the connection within `wait`: an open
    /// but quiet connection times out and is not closed. The timeouts go
    /// back to [`CLIENT_TIMEOUT`].
    pub fn closed_within(&mut self, wait: Duration) -> bool {
        self.set_timeout(Some(wait)).expect("set a timeout");
        let mut b = [0u8; 1];
        let closed = match self.stream.read(&mut b) {
            Ok(0) => true,
            Ok(_) => false,
            Err(e) => !matches!(
                e.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
            ),
        };
        self.set_timeout(Some(CLIENT_TIMEOUT))
            .expect("set a timeout");
        closed
    }
}

/// A loop device over a file, detached on drop.
pub struct LoopDevice(pub PathBuf);

impl LoopDevice {
    /// `losetup --find --show backing`: fails the test (never skips) if it
    /// cannot.
    pub fn attach(backing: &Path) -> LoopDevice {
        let out = Command::new("losetup")
            .args(["--find", "--show"])
            .arg(backing)
            .output()
            .expect(
                "cannot run losetup: these tests need util-linux's losetup, root and loop devices",
            );
        assert!(
            out.status.success(),
            "losetup failed (needs root and loop devices): {}",
            String::from_utf8_lossy(&out.stderr)
        );
        LoopDevice(PathBuf::from(
            String::from_utf8(out.stdout)
                .expect("losetup prints a path")
                .trim()
                .to_string(),
        ))
    }
}

impl Drop for LoopDevice {
    fn drop(&mut self) {
        let _ = Command::new("losetup").arg("-d").arg(&self.0).status();
    }
}
