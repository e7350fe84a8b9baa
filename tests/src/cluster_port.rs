//! A cluster-port client written from SPEC §4.5 and §6.6 alone (the suite shares no code with
//! the broker): frames, the HMAC handshake, raw requests. Tests use it as an outsider would,
//! to check what the port lets through.
//!
//! Frame: magic `NRD1`, version 1, type u8, request id u64, payload length u32 (big-endian),
//! payload. Handshake: the server sends `AuthChallenge` (type 1: 32-byte nonce ‖ server id);
//! the client answers `AuthResponse` (type 2: u16 id length ‖ id ‖
//! HMAC-SHA256(secret, "narad-cluster-auth-v1" ‖ nonce ‖ id)); the server answers `AuthOk`
//! (type 3) or `Error` (type 4) and closes.

use std::time::Duration;

use hmac::{Hmac, Mac};
use sha2::Sha256;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

pub const AUTH_CHALLENGE: u8 = 1;
pub const AUTH_RESPONSE: u8 = 2;
pub const AUTH_OK: u8 = 3;
pub const ERROR: u8 = 4;
pub const REQUEST: u8 = 7;
pub const REPLY: u8 = 8;

/// One frame as read from the wire.
#[derive(Debug, Clone)]
pub struct Frame {
    pub kind: u8,
    pub request_id: u64,
    pub payload: Vec<u8>,
}

/// The 18-byte header of a frame of `kind` announcing `len` payload bytes.
pub fn header(kind: u8, request_id: u64, len: u32) -> Vec<u8> {
    let mut h = Vec::with_capacity(18);
    h.extend_from_slice(b"NRD1");
    h.push(1);
    h.push(kind);
    h.extend_from_slice(&request_id.to_be_bytes());
    h.extend_from_slice(&len.to_be_bytes());
    h
}

pub fn encode(kind: u8, request_id: u64, payload: &[u8]) -> Vec<u8> {
    let mut f = header(kind, request_id, payload.len() as u32);
    f.extend_from_slice(payload);
    f
}

/// `HMAC-SHA256(secret, "narad-cluster-auth-v1" ‖ nonce ‖ node id)`.
pub fn proof(secret: &[u8], nonce: &[u8], node_id: &str) -> Vec<u8> {
    let mut mac = Hmac::<Sha256>::new_from_slice(secret).expect("any key length");
    mac.update(b"narad-cluster-auth-v1");
    mac.update(nonce);
    mac.update(node_id.as_bytes());
    mac.finalize().into_bytes().to_vec()
}

/// A raw connection to a cluster port.
pub struct Conn {
    pub stream: TcpStream,
}

impl Conn {
    pub async fn connect(addr: &str) -> std::io::Result<Conn> {
        Ok(Conn {
            stream: TcpStream::connect(addr).await?,
        })
    }

    pub async fn send(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        self.stream.write_all(bytes).await
    }

    /// The next frame; `None` on end of stream (or a reset) or after 5 s of silence.
    pub async fn next(&mut self) -> Option<Frame> {
        let read = async {
            let mut h = [0u8; 18];
            self.stream.read_exact(&mut h).await.ok()?;
            assert_eq!(&h[..4], b"NRD1", "frame magic");
            let len = u32::from_be_bytes(h[14..18].try_into().unwrap()) as usize;
            assert!(len <= 16 << 20, "frame of {len} bytes");
            let mut payload = vec![0u8; len];
            self.stream.read_exact(&mut payload).await.ok()?;
            Some(Frame {
                kind: h[5],
                request_id: u64::from_be_bytes(h[6..14].try_into().unwrap()),
                payload,
            })
        };
        tokio::time::timeout(Duration::from_secs(5), read)
            .await
            .ok()
            .flatten()
    }

    /// Reads the challenge and answers it as `node_id` with `secret`; returns the server's
    /// verdict frame (`AUTH_OK` or `ERROR`), `None` if the connection closed first.
    pub async fn handshake(&mut self, node_id: &str, secret: &[u8]) -> Option<Frame> {
        let ch = self.next().await?;
        assert_eq!(ch.kind, AUTH_CHALLENGE, "the server speaks first");
        let nonce = &ch.payload[..32];
        let mut resp = (node_id.len() as u16).to_be_bytes().to_vec();
        resp.extend_from_slice(node_id.as_bytes());
        resp.extend_from_slice(&proof(secret, nonce, node_id));
        self.send(&encode(AUTH_RESPONSE, 0, &resp)).await.ok()?;
        self.next().await
    }

    /// Sends request `op` with a JSON body and returns the reply's status and body.
    pub async fn request(&mut self, id: u64, op: u8, body: &[u8]) -> Option<(u16, Vec<u8>)> {
        let mut payload = vec![op];
        payload.extend_from_slice(body);
        self.send(&encode(REQUEST, id, &payload)).await.ok()?;
        let f = self.next().await?;
        if f.kind != REPLY {
            return None;
        }
        let status = u16::from_be_bytes([f.payload[0], f.payload[1]]);
        let ct = usize::from(u16::from_be_bytes([f.payload[2], f.payload[3]]));
        Some((status, f.payload[4 + ct..].to_vec()))
    }
}
