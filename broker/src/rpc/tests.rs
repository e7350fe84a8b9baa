//! The RPC layer end to end over real TCP on 127.0.0.1 (port 0): handshake, multiplexing,
//! timeouts, reconnects, version skew, frame limits, shutdown, and a 3-node metadata Raft
//! cluster whose traffic goes through `RpcRaftTransport`.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use narad_meta::{Meta, MetaCommand, MetaError, MetaOptions, MetaResponse, TopicConfig};
use parking_lot::Mutex;
use tokio::io::AsyncWriteExt;
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;

use super::auth::{self, AUTH_FAILED};
use super::proto::{
    encode_request, Frame, FrameReader, FrameType, HEADER_LEN, MAGIC, MAX_PAYLOAD, PROTOCOL_VERSION,
};
use super::*;

fn secret() -> ClusterSecret {
    ClusterSecret::new("correct horse battery staple")
}

/// Replies `200 {"from", "op", "body"}`; a body of digits is first slept on (ms).
fn echo() -> Arc<dyn RpcHandler> {
    handler_fn(|from, op, body| async move {
        let text = String::from_utf8_lossy(&body).into_owned();
        if let Ok(ms) = text.parse::<u64>() {
            tokio::time::sleep(Duration::from_millis(ms)).await;
        }
        RpcReply::json(
            200,
            &serde_json::json!({ "from": from, "op": op, "body": text }),
        )
    })
}

/// An older build: serves opcodes 1–10 only.
fn old_peer() -> Arc<dyn RpcHandler> {
    handler_fn(|_from, op, body| async move {
        if op > 10 {
            return RpcReply::unsupported(op);
        }
        RpcReply::new(
            202,
            "text/plain",
            format!("old:{op}:{}", String::from_utf8_lossy(&body)),
        )
    })
}

async fn serve(id: &str, handler: Arc<dyn RpcHandler>) -> RpcServer {
    RpcServer::bind("127.0.0.1:0", id, secret(), handler)
        .await
        .unwrap()
}

fn client_of(srv: &RpcServer) -> PeerClient {
    PeerClient::new("cli", "srv", srv.local_addr().to_string(), secret())
}

fn json(r: &RpcReply) -> serde_json::Value {
    serde_json::from_slice(&r.body).unwrap()
}

/// A hand-driven connection: handshake done, frames written and read directly.
async fn raw_connect(
    srv: &RpcServer,
    id: &str,
    secret: &ClusterSecret,
) -> (FrameReader<OwnedReadHalf>, OwnedWriteHalf) {
    let s = TcpStream::connect(srv.local_addr()).await.unwrap();
    let (r, mut w) = s.into_split();
    let mut r = FrameReader::new(r);
    let ch = r.next().await.unwrap().unwrap();
    assert_eq!(ch.kind, FrameType::AuthChallenge);
    assert_eq!(ch.request_id, 0);
    let (nonce, server_id) = auth::decode_challenge(&ch.payload).unwrap();
    assert_eq!(server_id, "srv");
    let proof = secret.proof(&nonce, id);
    let resp = Frame::new(
        FrameType::AuthResponse,
        0,
        auth::encode_response(id, &proof),
    );
    w.write_all(&resp.encode().unwrap()).await.unwrap();
    (r, w)
}

async fn send(w: &mut OwnedWriteHalf, f: Frame) {
    w.write_all(&f.encode().unwrap()).await.unwrap();
}

async fn next(r: &mut FrameReader<OwnedReadHalf>) -> Option<Frame> {
    tokio::time::timeout(Duration::from_secs(5), r.next())
        .await
        .expect("a frame or EOF in time")
        .unwrap_or(None)
}

#[tokio::test]
async fn handshake_authenticates_and_requests_flow() {
    let srv = serve("srv", echo()).await;
    let c = client_of(&srv);
    assert!(!c.is_connected(), "connects lazily");
    let r = c
        .call(Opcode::GetTopic, Bytes::from_static(b"orders"))
        .await
        .unwrap();
    assert_eq!(r.status, 200);
    assert_eq!(r.content_type, "application/json");
    assert_eq!(
        json(&r),
        serde_json::json!({"from": "cli", "op": 20, "body": "orders"})
    );
    assert!(c.is_connected());
    c.ping(Duration::from_secs(1)).await.unwrap();
    let s = srv.stats();
    assert_eq!((s.accepted, s.authenticated, s.auth_failures), (1, 1, 0));

    // The raw view: challenge → response → AuthOk, then a Ping is answered with a Pong.
    let (mut r, mut w) = raw_connect(&srv, "raw", &secret()).await;
    assert_eq!(next(&mut r).await.unwrap().kind, FrameType::AuthOk);
    send(&mut w, Frame::new(FrameType::Ping, 77, &b"hi"[..])).await;
    let pong = next(&mut r).await.unwrap();
    assert_eq!(
        (pong.kind, pong.request_id, &pong.payload[..]),
        (FrameType::Pong, 77, &b"hi"[..])
    );
    srv.shutdown(Duration::from_secs(1)).await;
}

#[tokio::test]
async fn no_secret_mode_still_runs_the_handshake() {
    let srv = RpcServer::bind("127.0.0.1:0", "srv", ClusterSecret::none(), echo())
        .await
        .unwrap();
    let c = PeerClient::new(
        "cli",
        "srv",
        srv.local_addr().to_string(),
        ClusterSecret::none(),
    );
    assert_eq!(c.call(Opcode::Ack, Bytes::new()).await.unwrap().status, 200);
    // A node with a secret cannot talk to one without (and vice versa).
    let with = PeerClient::new("cli2", "srv", srv.local_addr().to_string(), secret());
    assert!(matches!(
        with.call(Opcode::Ack, Bytes::new()).await,
        Err(RpcError::Auth(_))
    ));
    let s = srv.stats();
    assert_eq!((s.authenticated, s.auth_failures), (1, 1));
    srv.shutdown(Duration::from_secs(1)).await;
}

/// Reports whether the caller's proof meant anything (`Caller::proven`).
fn proven_echo() -> Arc<dyn RpcHandler> {
    struct H;
    impl RpcHandler for H {
        fn handle<'a>(
            &'a self,
            caller: &'a Caller,
            _op: u8,
            _body: Bytes,
        ) -> BoxFuture<'a, RpcReply> {
            Box::pin(
                async move { RpcReply::json(200, &serde_json::json!({ "proven": caller.proven })) },
            )
        }
    }
    Arc::new(H)
}

#[tokio::test]
async fn callers_are_proven_only_by_a_real_secret() {
    for (secret, proven) in [
        (ClusterSecret::none(), false),
        (secret(), true),
        (ClusterSecret::random(), true),
    ] {
        let srv = RpcServer::bind("127.0.0.1:0", "srv", secret.clone(), proven_echo())
            .await
            .unwrap();
        let c = PeerClient::new("cli", "srv", srv.local_addr().to_string(), secret);
        let r = c.call(Opcode::CreateUser, Bytes::new()).await.unwrap();
        assert_eq!(json(&r), serde_json::json!({ "proven": proven }));
        srv.shutdown(Duration::from_secs(1)).await;
    }
    // A random secret (a standalone node's) admits nobody who does not hold it: neither the
    // empty key nor another random one.
    let srv = RpcServer::bind("127.0.0.1:0", "srv", ClusterSecret::random(), proven_echo())
        .await
        .unwrap();
    for guess in [ClusterSecret::none(), ClusterSecret::random()] {
        let c = PeerClient::new("cli", "srv", srv.local_addr().to_string(), guess);
        assert!(matches!(
            c.call(Opcode::CreateUser, Bytes::new()).await,
            Err(RpcError::Auth(_))
        ));
    }
    assert_eq!(srv.stats().authenticated, 0);
    srv.shutdown(Duration::from_secs(1)).await;
}

#[tokio::test]
async fn before_the_proof_only_small_frames_are_read() {
    let srv = serve("srv", echo()).await;
    // An "auth response" announcing the 16 MiB maximum: refused from its header, before a
    // payload byte is buffered.
    let s = TcpStream::connect(srv.local_addr()).await.unwrap();
    let (r, mut w) = s.into_split();
    let mut r = FrameReader::new(r);
    assert_eq!(next(&mut r).await.unwrap().kind, FrameType::AuthChallenge);
    let mut header = Vec::with_capacity(HEADER_LEN);
    header.extend_from_slice(&MAGIC);
    header.push(PROTOCOL_VERSION);
    header.push(FrameType::AuthResponse as u8);
    header.extend_from_slice(&0u64.to_be_bytes());
    header.extend_from_slice(&(MAX_PAYLOAD as u32).to_be_bytes());
    w.write_all(&header).await.unwrap();
    let e = next(&mut r).await.unwrap();
    assert_eq!(e.kind, FrameType::Error);
    assert!(
        String::from_utf8_lossy(&e.payload).contains("1024 bytes accepted here"),
        "{:?}",
        String::from_utf8_lossy(&e.payload)
    );
    assert!(next(&mut r).await.is_none(), "connection closed");
    assert_eq!(srv.stats().auth_failures, 1);
    srv.shutdown(Duration::from_secs(1)).await;
}

#[tokio::test]
async fn a_frame_buffer_grows_with_the_bytes_that_arrived() {
    // A header announcing 16 MiB followed by 100 bytes: the reader holds about what arrived,
    // not what was announced.
    let (mut tx, rx) = tokio::io::duplex(1 << 20);
    let mut r = FrameReader::new(rx);
    let mut bytes = Vec::new();
    bytes.extend_from_slice(&MAGIC);
    bytes.push(PROTOCOL_VERSION);
    bytes.push(FrameType::Request as u8);
    bytes.extend_from_slice(&1u64.to_be_bytes());
    bytes.extend_from_slice(&(MAX_PAYLOAD as u32).to_be_bytes());
    bytes.extend_from_slice(&[0u8; 100]);
    tx.write_all(&bytes).await.unwrap();
    assert!(
        tokio::time::timeout(Duration::from_millis(200), r.next())
            .await
            .is_err(),
        "the frame is incomplete"
    );
    assert!(
        r.buffer_capacity() <= 256 * 1024,
        "buffer of {} bytes for 118 received",
        r.buffer_capacity()
    );
    // The rest arrives: the frame is read whole.
    let rest = vec![1u8; MAX_PAYLOAD - 100];
    let writer = tokio::spawn(async move {
        tx.write_all(&rest).await.unwrap();
        tx
    });
    let f = tokio::time::timeout(Duration::from_secs(10), r.next())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(f.payload.len(), MAX_PAYLOAD);
    drop(writer.await.unwrap());
}

#[tokio::test]
async fn connections_past_the_handshake_cap_are_closed_at_once() {
    let srv = serve("srv", echo()).await;
    // MAX_HANDSHAKES connections that never answer the challenge hold every handshake slot.
    let mut idle = Vec::new();
    for _ in 0..server::MAX_HANDSHAKES {
        let s = TcpStream::connect(srv.local_addr()).await.unwrap();
        let (r, w) = s.into_split();
        let mut r = FrameReader::new(r);
        assert_eq!(next(&mut r).await.unwrap().kind, FrameType::AuthChallenge);
        idle.push((r, w));
    }
    // One more is closed without a challenge.
    let s = TcpStream::connect(srv.local_addr()).await.unwrap();
    let (r, _w) = s.into_split();
    let mut r = FrameReader::new(r);
    assert!(next(&mut r).await.is_none(), "closed at once");
    assert_eq!(srv.stats().refused_over_cap, 1);
    // Authenticated connections do not hold a slot; freeing slots admits new ones.
    drop(idle);
    let deadline = Instant::now() + Duration::from_secs(10);
    while srv.stats().open > 0 {
        assert!(Instant::now() < deadline, "closed connections still open");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let c = client_of(&srv);
    assert_eq!(c.call(Opcode::Ack, Bytes::new()).await.unwrap().status, 200);
    srv.shutdown(Duration::from_secs(1)).await;
}

#[tokio::test]
async fn wrong_secret_is_refused_and_the_connection_closed() {
    let srv = serve("srv", echo()).await;
    let bad = PeerClient::new(
        "intruder",
        "srv",
        srv.local_addr().to_string(),
        ClusterSecret::new("guess"),
    );
    match bad.call(Opcode::CreateTopic, Bytes::new()).await {
        Err(RpcError::Auth(m)) => {
            assert!(m.contains(AUTH_FAILED), "{m}");
            assert!(
                !m.contains("guess") && !m.contains("horse"),
                "no secret in errors: {m}"
            );
        }
        other => panic!("expected Auth, got {other:?}"),
    }
    assert!(!bad.is_connected());
    // Within the back-off the error is repeated without another connection.
    assert!(matches!(
        bad.call(Opcode::Ack, Bytes::new()).await,
        Err(RpcError::Auth(_))
    ));
    let s = srv.stats();
    assert_eq!((s.accepted, s.authenticated, s.auth_failures), (1, 0, 1));

    // On the wire: an Error frame (id 0, nothing but "authentication failed"), then EOF.
    let (mut r, _w) = raw_connect(&srv, "intruder", &ClusterSecret::new("guess")).await;
    let e = next(&mut r).await.unwrap();
    assert_eq!(
        (e.kind, e.request_id, &e.payload[..]),
        (FrameType::Error, 0, AUTH_FAILED.as_bytes())
    );
    assert!(next(&mut r).await.is_none(), "connection closed");

    // Not speaking the protocol at all (an HTTP client on the cluster port).
    let s = TcpStream::connect(srv.local_addr()).await.unwrap();
    let (r, mut w) = s.into_split();
    let mut r = FrameReader::new(r);
    assert_eq!(next(&mut r).await.unwrap().kind, FrameType::AuthChallenge);
    w.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    assert_eq!(next(&mut r).await.unwrap().kind, FrameType::Error);
    assert!(next(&mut r).await.is_none());
    assert_eq!(srv.stats().auth_failures, 3);

    // A right secret under a spoofed name fails too: the proof binds the node id.
    let (mut r, _w) = {
        let s = TcpStream::connect(srv.local_addr()).await.unwrap();
        let (r, mut w) = s.into_split();
        let mut r = FrameReader::new(r);
        let ch = next(&mut r).await.unwrap();
        let (nonce, _) = auth::decode_challenge(&ch.payload).unwrap();
        let proof = secret().proof(&nonce, "narad-1");
        send(
            &mut w,
            Frame::new(
                FrameType::AuthResponse,
                0,
                auth::encode_response("narad-2", &proof),
            ),
        )
        .await;
        (r, w)
    };
    assert_eq!(next(&mut r).await.unwrap().kind, FrameType::Error);
    assert!(next(&mut r).await.is_none());
    srv.shutdown(Duration::from_secs(1)).await;
}

#[tokio::test]
async fn client_refuses_an_address_serving_another_node() {
    let srv = serve("srv", echo()).await;
    let c = PeerClient::new("cli", "narad-9", srv.local_addr().to_string(), secret());
    match c.call(Opcode::Ack, Bytes::new()).await {
        Err(RpcError::Unreachable(m)) => assert!(m.contains("is node srv, not narad-9"), "{m}"),
        other => panic!("{other:?}"),
    }
    // An empty peer id accepts whoever answers (a seed address).
    let any = PeerClient::new("cli", "", srv.local_addr().to_string(), secret());
    assert_eq!(
        any.call(Opcode::Ack, Bytes::new()).await.unwrap().status,
        200
    );
    srv.shutdown(Duration::from_secs(1)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_concurrent_requests_share_one_connection_and_complete_out_of_order() {
    let srv = serve("srv", echo()).await;
    let c = client_of(&srv);
    const N: usize = 200;
    let done = Arc::new(Mutex::new(Vec::with_capacity(N)));
    let calls = (0..N).map(|i| {
        let (c, done) = (c.clone(), done.clone());
        async move {
            // The first sent sleeps longest.
            let delay = (N - i) as u64;
            let r = c
                .call(Opcode::Consume, Bytes::from(delay.to_string()))
                .await
                .unwrap();
            assert_eq!(
                json(&r)["body"],
                delay.to_string(),
                "reply matched to its request"
            );
            done.lock().push(i);
        }
    });
    futures::future::join_all(calls).await;
    let done = done.lock().clone();
    assert_eq!(done.len(), N);
    assert!(
        done.windows(2).any(|w| w[0] > w[1]),
        "replies arrived out of order"
    );
    let s = srv.stats();
    assert_eq!(
        (s.accepted, s.requests),
        (1, N as u64),
        "one multiplexed connection"
    );

    // On the wire: request 1 (slow) is answered after request 2 (fast).
    let (mut r, mut w) = raw_connect(&srv, "raw", &secret()).await;
    assert_eq!(next(&mut r).await.unwrap().kind, FrameType::AuthOk);
    send(
        &mut w,
        Frame::new(FrameType::Request, 1, encode_request(2, b"300")),
    )
    .await;
    send(
        &mut w,
        Frame::new(FrameType::Request, 2, encode_request(2, b"fast")),
    )
    .await;
    let first = next(&mut r).await.unwrap();
    let second = next(&mut r).await.unwrap();
    assert_eq!((first.kind, first.request_id), (FrameType::Reply, 2));
    assert_eq!((second.kind, second.request_id), (FrameType::Reply, 1));
    let reply = RpcReply::decode(second.payload).unwrap();
    assert_eq!(json(&reply)["body"], "300");
    srv.shutdown(Duration::from_secs(1)).await;
}

#[tokio::test]
async fn a_request_times_out_and_the_connection_stays_usable() {
    let srv = serve("srv", echo()).await;
    let c = client_of(&srv);
    let start = Instant::now();
    let r = c
        .call_timeout(
            Opcode::Consume,
            Bytes::from_static(b"3000"),
            Duration::from_millis(200),
        )
        .await;
    assert_eq!(r, Err(RpcError::Timeout));
    assert!(r.unwrap_err().outcome_unknown());
    assert!(start.elapsed() < Duration::from_secs(2));
    // The late reply is dropped quietly; the connection serves the next call.
    let r = c
        .call(Opcode::Consume, Bytes::from_static(b"x"))
        .await
        .unwrap();
    assert_eq!(r.status, 200);
    assert_eq!(srv.stats().accepted, 1);
    // A connect to a black hole is bounded by the caller's timeout too (non-routable addr).
    let lost = PeerClient::new("cli", "x", "10.255.255.1:7943", secret());
    let start = Instant::now();
    let r = lost
        .call_timeout(Opcode::Ack, Bytes::new(), Duration::from_millis(300))
        .await;
    // It never connected, so nothing was sent: a certain failure, not a timeout.
    match r {
        Err(e @ RpcError::Unreachable(_)) => assert!(!e.outcome_unknown()),
        other => panic!("{other:?}"),
    }
    assert!(start.elapsed() < Duration::from_secs(2));
    srv.shutdown(Duration::from_millis(100)).await;
}

/// Counts the calls a handler ran, per opcode; answers `204`.
fn counting(seen: Arc<Mutex<Vec<u8>>>) -> Arc<dyn RpcHandler> {
    handler_fn(move |_from, op, _body| {
        let seen = seen.clone();
        async move {
            seen.lock().push(op);
            RpcReply::new(204, "application/json", Bytes::new())
        }
    })
}

#[tokio::test]
async fn a_reply_lost_after_the_request_was_written_is_outcome_unknown() {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let srv = serve("srv", counting(seen.clone())).await;
    let peers =
        Peers::new("cli", secret()).with_faults(vec![RpcFault::parse("after:3:2").unwrap()]);
    peers.upsert("srv", &srv.local_addr().to_string());
    // The first Ack is answered; other opcodes do not count towards the fault.
    let call = |op: Opcode| peers.call("srv", op, Bytes::new(), DEFAULT_TIMEOUT);
    assert_eq!(call(Opcode::Ack).await.unwrap().status, 204);
    assert_eq!(call(Opcode::Nack).await.unwrap().status, 204);
    // The second is written and its reply lost: the peer ran it (before the caller hears
    // of the failure), the caller cannot know.
    match call(Opcode::Ack).await {
        Err(e @ RpcError::Disconnected(_)) => assert!(e.outcome_unknown(), "{e}"),
        other => panic!("{other:?}"),
    }
    assert_eq!(seen.lock().iter().filter(|op| **op == 3).count(), 2);
    // The fault fires once.
    assert_eq!(call(Opcode::Ack).await.unwrap().status, 204);
    assert_eq!(seen.lock().iter().filter(|op| **op == 3).count(), 3);
    srv.shutdown(Duration::from_millis(100)).await;
}

#[tokio::test]
async fn a_connection_lost_before_the_request_was_written_is_not_sent() {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let srv = serve("srv", counting(seen.clone())).await;
    let peers =
        Peers::new("cli", secret()).with_faults(vec![RpcFault::parse("before:31:1").unwrap()]);
    peers.upsert("srv", &srv.local_addr().to_string());
    let call = |op: Opcode| peers.call("srv", op, Bytes::new(), DEFAULT_TIMEOUT);
    match call(Opcode::AckBatch).await {
        Err(e @ RpcError::NotSent(_)) => assert!(!e.outcome_unknown(), "{e}"),
        other => panic!("{other:?}"),
    }
    // Nothing reached the peer: the next call (a new connection) is the first it runs.
    assert_eq!(call(Opcode::AckBatch).await.unwrap().status, 204);
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(*seen.lock(), vec![31]);
    srv.shutdown(Duration::from_millis(100)).await;
}

#[tokio::test]
async fn a_peer_that_stops_with_requests_in_flight_leaves_their_outcome_unknown() {
    let srv = serve("srv", echo()).await;
    let c = client_of(&srv);
    let slow = tokio::spawn({
        let c = c.clone();
        async move { c.call(Opcode::AckBatch, Bytes::from_static(b"5000")).await }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    srv.shutdown(Duration::from_millis(50)).await;
    let e = slow.await.unwrap().unwrap_err();
    assert!(e.outcome_unknown(), "{e:?}");
    // Down now: a refused connect is certain.
    let e = c.call(Opcode::AckBatch, Bytes::new()).await.unwrap_err();
    assert!(!e.outcome_unknown(), "{e:?}");
}

#[test]
fn which_failures_leave_the_outcome_unknown() {
    let certain = [
        RpcError::Unreachable("refused".into()),
        RpcError::NotSent("queued".into()),
        RpcError::Auth("bad secret".into()),
        RpcError::Protocol("raft not ready".into()),
        RpcError::PeerTooOld { op: 31 },
    ];
    let unknown = [
        RpcError::Timeout,
        RpcError::Disconnected("reset".into()),
        RpcError::BadReply("garbage".into()),
    ];
    assert!(certain.iter().all(|e| !e.outcome_unknown()));
    assert!(unknown.iter().all(|e| e.outcome_unknown()));
}

#[test]
fn fault_specs_parse() {
    assert_eq!(
        RpcFault::parse(" after:31:2").unwrap(),
        RpcFault {
            point: FaultPoint::AfterSend,
            op: 31,
            nth: 2
        }
    );
    assert_eq!(
        RpcFault::parse("before:2:1").unwrap().point,
        FaultPoint::BeforeSend
    );
    for bad in [
        "",
        "after",
        "after:31",
        "later:31:1",
        "after:x:1",
        "after:31:0",
        "after:31:1:2",
        "after:300:1",
    ] {
        assert!(RpcFault::parse(bad).is_err(), "{bad}");
    }
}

#[tokio::test]
async fn client_reconnects_after_the_server_restarts() {
    let srv = serve("srv", echo()).await;
    let addr = srv.local_addr();
    let c = client_of(&srv);
    assert_eq!(c.call(Opcode::Ack, Bytes::new()).await.unwrap().status, 200);
    srv.shutdown(Duration::from_secs(1)).await;

    match c.call(Opcode::Ack, Bytes::new()).await {
        // Refused, or queued on the connection the server just closed: never sent.
        Err(e @ (RpcError::Unreachable(_) | RpcError::NotSent(_))) => {
            assert!(!e.outcome_unknown())
        }
        other => panic!("expected the peer to be down, got {other:?}"),
    }
    // Down: connects fail fast (refused, then the back-off).
    let start = Instant::now();
    for _ in 0..20 {
        assert!(c.call(Opcode::Ack, Bytes::new()).await.is_err());
    }
    assert!(start.elapsed() < Duration::from_secs(2));

    let srv = RpcServer::bind(&addr.to_string(), "srv", secret(), echo())
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        match c.call(Opcode::Ack, Bytes::new()).await {
            Ok(r) => {
                assert_eq!(r.status, 200);
                break;
            }
            Err(e) if Instant::now() < deadline => {
                assert!(
                    matches!(e, RpcError::Unreachable(_) | RpcError::NotSent(_)),
                    "{e:?}"
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => panic!("never reconnected: {e}"),
        }
    }
    assert_eq!(srv.stats().authenticated, 1);
    srv.shutdown(Duration::from_secs(1)).await;
}

#[tokio::test]
async fn in_flight_requests_fail_as_disconnected_when_the_connection_drops() {
    // A server that authenticates, reads one request and then closes without answering.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let (s, _) = listener.accept().await.unwrap();
        let (r, mut w) = s.into_split();
        let mut r = FrameReader::new(r);
        let nonce = auth::new_nonce();
        send(
            &mut w,
            Frame::new(
                FrameType::AuthChallenge,
                0,
                auth::encode_challenge(&nonce, "srv"),
            ),
        )
        .await;
        let _resp = r.next().await.unwrap().unwrap();
        send(&mut w, Frame::new(FrameType::AuthOk, 0, Bytes::new())).await;
        let req = r.next().await.unwrap().unwrap();
        assert_eq!(req.kind, FrameType::Request);
    });
    let c = PeerClient::new("cli", "srv", addr.to_string(), secret());
    match c.call(Opcode::CommitProduce, Bytes::new()).await {
        Err(e @ RpcError::Disconnected(_)) => assert!(e.outcome_unknown()),
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn unknown_opcode_is_400_and_reads_as_peer_too_old() {
    let srv = serve("srv", old_peer()).await;
    let c = client_of(&srv);
    // Not in this build's registry at all: the server answers without the handler.
    assert_eq!(
        c.call(200u8, Bytes::new()).await,
        Err(RpcError::PeerTooOld { op: 200 })
    );
    // Known to the registry, not served by this (older) handler.
    assert_eq!(
        c.call(Opcode::AckBatch, Bytes::new()).await,
        Err(RpcError::PeerTooOld { op: 31 })
    );
    let served = srv.stats().requests;
    // Remembered for the connection: no second round trip.
    assert_eq!(
        c.call(Opcode::AckBatch, Bytes::new()).await,
        Err(RpcError::PeerTooOld { op: 31 })
    );
    assert_eq!(srv.stats().requests, served);

    // The exact wire answer.
    let (mut r, mut w) = raw_connect(&srv, "raw", &secret()).await;
    assert_eq!(next(&mut r).await.unwrap().kind, FrameType::AuthOk);
    send(
        &mut w,
        Frame::new(FrameType::Request, 5, encode_request(99, b"{}")),
    )
    .await;
    let f = next(&mut r).await.unwrap();
    assert_eq!((f.kind, f.request_id), (FrameType::Reply, 5));
    let reply = RpcReply::decode(f.payload).unwrap();
    assert_eq!(reply.status, 400);
    // The message of every build, and the stable code of builds since error codes.
    assert_eq!(
        &reply.body[..],
        br#"{"error":"unsupported rpc operation 99","code":21}"#
    );
    // An unknown frame type fails only its request id; the connection goes on.
    let mut raw = Frame::new(FrameType::Ping, 6, Bytes::new())
        .encode()
        .unwrap()
        .to_vec();
    raw[5] = 250;
    w.write_all(&raw).await.unwrap();
    let f = next(&mut r).await.unwrap();
    assert_eq!((f.kind, f.request_id), (FrameType::Error, 6));
    send(&mut w, Frame::new(FrameType::Ping, 7, Bytes::new())).await;
    assert_eq!(next(&mut r).await.unwrap().request_id, 7);
    srv.shutdown(Duration::from_secs(1)).await;
}

#[tokio::test]
async fn new_client_falls_back_to_an_older_opcode_on_an_old_peer() {
    let srv = serve("srv", old_peer()).await;
    let addr = srv.local_addr();
    let c = client_of(&srv);
    let attempts = [
        (Opcode::CommitProduceBatch, Bytes::from_static(b"[r1,r2]")),
        (Opcode::CommitProduce, Bytes::from_static(b"r1")),
    ];
    let (op, r) = c
        .call_with_fallback(&attempts, COMMIT_TIMEOUT)
        .await
        .unwrap();
    assert_eq!(op, Opcode::CommitProduce as u8);
    assert_eq!((r.status, &r.body[..]), (202, &b"old:10:r1"[..]));
    // Old opcodes keep working against the old peer.
    let r = c
        .call(Opcode::Produce, Bytes::from_static(b"m"))
        .await
        .unwrap();
    assert_eq!(&r.body[..], b"old:1:m");
    // Nothing it knows: the last PeerTooOld.
    let none = [
        (Opcode::AckBatch, Bytes::new()),
        (Opcode::ConsumeBatch, Bytes::new()),
    ];
    assert_eq!(
        c.call_with_fallback(&none, DEFAULT_TIMEOUT).await,
        Err(RpcError::PeerTooOld { op: 30 })
    );

    // The peer is upgraded (restart on the same address): the new opcode is used again.
    srv.shutdown(Duration::from_secs(1)).await;
    let srv = RpcServer::bind(&addr.to_string(), "srv", secret(), echo())
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    let (op, r) = loop {
        match c.call_with_fallback(&attempts, COMMIT_TIMEOUT).await {
            Ok(x) => break x,
            Err(e) if Instant::now() < deadline && !matches!(e, RpcError::PeerTooOld { .. }) => {
                tokio::time::sleep(Duration::from_millis(50)).await
            }
            Err(e) => panic!("{e}"),
        }
    };
    assert_eq!(op, Opcode::CommitProduceBatch as u8);
    assert_eq!(json(&r)["body"], "[r1,r2]");
    srv.shutdown(Duration::from_secs(1)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn frames_over_16_mib_are_refused() {
    let srv = serve(
        "srv",
        handler_fn(|_, _, body| async move { RpcReply::json(200, &body.len()) }),
    )
    .await;
    let c = client_of(&srv);
    // Opcode + body = exactly 16 MiB: the largest legal frame, carried end to end.
    let r = c
        .call(
            Opcode::FetchSegmentChunk,
            Bytes::from(vec![7u8; MAX_PAYLOAD - 1]),
        )
        .await
        .unwrap();
    assert_eq!(json(&r), serde_json::json!(MAX_PAYLOAD - 1));
    // One byte more is refused before anything is sent; the connection is unaffected.
    let served = srv.stats().requests;
    match c
        .call(
            Opcode::FetchSegmentChunk,
            Bytes::from(vec![7u8; MAX_PAYLOAD]),
        )
        .await
    {
        Err(RpcError::Protocol(m)) => assert!(m.contains("16 MiB"), "{m}"),
        other => panic!("{other:?}"),
    }
    assert_eq!(srv.stats().requests, served);
    assert_eq!(c.call(Opcode::Ack, Bytes::new()).await.unwrap().status, 200);

    // A peer announcing a bigger frame gets a protocol error and is disconnected, from the
    // header alone (the server never waits for, or allocates, the payload).
    let (mut r, mut w) = raw_connect(&srv, "raw", &secret()).await;
    assert_eq!(next(&mut r).await.unwrap().kind, FrameType::AuthOk);
    let mut header = Vec::with_capacity(HEADER_LEN);
    header.extend_from_slice(&MAGIC);
    header.push(PROTOCOL_VERSION);
    header.push(FrameType::Request as u8);
    header.extend_from_slice(&9u64.to_be_bytes());
    header.extend_from_slice(&(MAX_PAYLOAD as u32 + 1).to_be_bytes());
    w.write_all(&header).await.unwrap();
    let e = next(&mut r).await.unwrap();
    assert_eq!((e.kind, e.request_id), (FrameType::Error, 0));
    assert!(String::from_utf8_lossy(&e.payload).contains("exceeds the 16 MiB limit"));
    assert!(next(&mut r).await.is_none(), "connection closed");

    // Bad magic mid-stream closes the connection too.
    let (mut r, mut w) = raw_connect(&srv, "raw", &secret()).await;
    assert_eq!(next(&mut r).await.unwrap().kind, FrameType::AuthOk);
    w.write_all(b"XXXX\x01\x07\0\0\0\0\0\0\0\x01\0\0\0\0")
        .await
        .unwrap();
    assert_eq!(next(&mut r).await.unwrap().kind, FrameType::Error);
    assert!(next(&mut r).await.is_none());
    srv.shutdown(Duration::from_secs(1)).await;
}

#[tokio::test]
async fn shutdown_lets_in_flight_requests_finish() {
    let srv = Arc::new(serve("srv", echo()).await);
    let c = client_of(&srv);
    c.ping(Duration::from_secs(1)).await.unwrap();
    let slow = tokio::spawn({
        let c = c.clone();
        async move { c.call(Opcode::Consume, Bytes::from_static(b"300")).await }
    });
    while srv.stats().requests == 0 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let start = Instant::now();
    srv.shutdown(Duration::from_secs(5)).await;
    assert!(
        start.elapsed() >= Duration::from_millis(100),
        "waited for the request"
    );
    assert_eq!(slow.await.unwrap().unwrap().status, 200);
    assert!(c.call(Opcode::Ack, Bytes::new()).await.is_err());
    assert_eq!(srv.stats().open, 0);

    // A grace shorter than the handler: shutdown returns on time anyway.
    let srv = serve("srv", echo()).await;
    let c = client_of(&srv);
    let stuck = tokio::spawn({
        let c = c.clone();
        async move { c.call(Opcode::Consume, Bytes::from_static(b"10000")).await }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let start = Instant::now();
    srv.shutdown(Duration::from_millis(200)).await;
    assert!(start.elapsed() < Duration::from_secs(2));
    assert!(matches!(
        stuck.await.unwrap(),
        Err(RpcError::Disconnected(_))
    ));
}

#[tokio::test]
async fn raft_frames_wait_for_a_raft_handler() {
    struct Upper(AtomicUsize);
    impl RaftHandler for Upper {
        fn handle_raft<'a>(
            &'a self,
            caller: &'a Caller,
            payload: Bytes,
        ) -> BoxFuture<'a, Result<Bytes, String>> {
            self.0.fetch_add(1, Ordering::SeqCst);
            Box::pin(async move {
                let from = &*caller.node_id;
                if payload.is_empty() {
                    return Err("empty".into());
                }
                Ok(Bytes::from(format!(
                    "{from}:{}",
                    String::from_utf8_lossy(&payload).to_uppercase()
                )))
            })
        }
    }
    let srv = serve("srv", echo()).await;
    let c = client_of(&srv);
    match c.raft(Bytes::from_static(b"vote"), DEFAULT_TIMEOUT).await {
        Err(RpcError::Protocol(m)) => assert_eq!(m, "raft not ready"),
        other => panic!("{other:?}"),
    }
    let h = Arc::new(Upper(AtomicUsize::new(0)));
    srv.set_raft_handler(h.clone());
    let r = c
        .raft(Bytes::from_static(b"vote"), DEFAULT_TIMEOUT)
        .await
        .unwrap();
    assert_eq!(&r[..], b"cli:VOTE");
    assert_eq!(
        c.raft(Bytes::new(), DEFAULT_TIMEOUT).await,
        Err(RpcError::Protocol("empty".into()))
    );
    assert_eq!(h.0.load(Ordering::SeqCst), 2);
    srv.shutdown(Duration::from_secs(1)).await;
}

#[tokio::test]
async fn peers_registry_follows_membership() {
    let a = serve("srv", echo()).await;
    let b = serve("srv", old_peer()).await;
    let other = serve("narad-9", echo()).await;
    let peers = Peers::new("me", secret());
    let a_addr = a.local_addr().to_string();
    let b_addr = b.local_addr().to_string();
    peers.sync([("srv", a_addr.as_str()), ("me", "127.0.0.1:1")]);
    assert_eq!(peers.ids(), ["srv"], "own entry ignored");
    let r = peers
        .call("srv", Opcode::Ack, Bytes::new(), DEFAULT_TIMEOUT)
        .await
        .unwrap();
    assert_eq!(json(&r)["from"], "me");

    // The node moved: the old connection is dropped, the next call goes to the new address.
    peers.sync([("srv", b_addr.as_str())]);
    let r = peers
        .call("srv", Opcode::Ack, Bytes::new(), DEFAULT_TIMEOUT)
        .await
        .unwrap();
    assert_eq!(&r.body[..], b"old:3:");
    // An address that now serves another node is noticed.
    peers.upsert("srv", &other.local_addr().to_string());
    assert!(matches!(
        peers.call("srv", Opcode::Ack, Bytes::new(), DEFAULT_TIMEOUT).await,
        Err(RpcError::Unreachable(m)) if m.contains("is node narad-9")
    ));

    peers.sync(std::iter::empty());
    assert!(peers.ids().is_empty());
    assert!(matches!(
        peers.call("srv", Opcode::Ack, Bytes::new(), DEFAULT_TIMEOUT).await,
        Err(RpcError::Unreachable(m)) if m.contains("unknown node")
    ));
    for s in [a, b, other] {
        s.shutdown(Duration::from_secs(1)).await;
    }
}

fn create(name: &str) -> MetaCommand {
    MetaCommand::CreateTopic {
        name: name.into(),
        config: TopicConfig {
            partitions: 3,
            retention_ms: 604_800_000,
            visibility_timeout_ms: 30_000,
            max_in_flight_per_partition: 1024,
            max_acked_ahead_per_partition: 1024,
            retry_backoff: None,
            dead_letter: None,
            dedup_window_ms: None,
        },
        owner: None,
        schema: None,
        created_at_ms: 1_767_225_600_000,
    }
}

/// Writes through whichever node leads, retrying while leadership settles.
async fn write_to_leader(metas: &[Meta], cmd: MetaCommand) -> (Meta, MetaResponse) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(leader) = metas.iter().find(|m| m.is_leader()) {
            match leader.write(cmd.clone()).await {
                Ok(r) => return (leader.clone(), r),
                Err(
                    MetaError::Unavailable(_)
                    | MetaError::NotLeader { .. }
                    | MetaError::Uncertain(_),
                ) if Instant::now() < deadline => {}
                Err(e) => panic!("{e}"),
            }
        }
        assert!(Instant::now() < deadline, "no leader accepted the write");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn eventually_has(meta: &Meta, topic: &str) {
    let mut applied = meta.subscribe();
    tokio::time::timeout(Duration::from_secs(15), async {
        while !meta.view().topics.contains_key(topic) {
            applied.changed().await.unwrap();
        }
    })
    .await
    .unwrap_or_else(|_| panic!("{} never saw {topic}", meta.node_id()));
}

/// The strongest check of the adapter: three `Meta` nodes whose only link is
/// `RpcRaftTransport` over authenticated TCP elect a leader, replicate a CreateTopic, and
/// after the leader dies the other two elect a new one and keep committing.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_metadata_nodes_elect_and_replicate_over_tcp() {
    let ids = ["narad-0", "narad-1", "narad-2"];
    let mut servers = Vec::new();
    for id in ids {
        servers.push(
            RpcServer::bind("127.0.0.1:0", id, secret(), echo())
                .await
                .unwrap(),
        );
    }
    let members: Vec<(String, String)> = ids
        .iter()
        .zip(&servers)
        .map(|(id, s)| (id.to_string(), s.local_addr().to_string()))
        .collect();
    let dirs: Vec<_> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    let mut metas = Vec::new();
    for (i, (id, addr)) in members.iter().enumerate() {
        let transport = Arc::new(RpcRaftTransport::new(id.clone(), secret()));
        let opts = MetaOptions {
            node_id: id.clone(),
            cluster_addr: addr.clone(),
        };
        let meta = Meta::open(dirs[i].path(), opts, transport).await.unwrap();
        servers[i].set_raft_handler(MetaRaftHandler::new(meta.clone(), true));
        metas.push(meta);
    }
    for meta in &metas {
        meta.initialize(&members).await.unwrap();
    }

    let (leader, r) = write_to_leader(&metas, create("orders")).await;
    let MetaResponse::Topic(t) = r else {
        panic!("expected a topic, got {r:?}")
    };
    for meta in &metas {
        eventually_has(meta, "orders").await;
        assert_eq!(meta.view().topics["orders"], t);
        assert_eq!(meta.current_leader().unwrap().0, *leader.node_id());
    }
    for (s, id) in servers.iter().zip(ids) {
        // Followers are sent AppendEntries over TCP (a leader may never have been sent
        // anything, if it won the first election).
        if id != leader.node_id() {
            assert!(s.stats().requests > 0, "raft traffic reached {id}");
        }
        assert_eq!(s.stats().auth_failures, 0);
    }

    // Kill the leader (its port and its Raft): the survivors elect a new leader over TCP.
    let dead = metas
        .iter()
        .position(|m| m.node_id() == leader.node_id())
        .unwrap();
    servers[dead].shutdown(Duration::from_millis(100)).await;
    metas[dead].shutdown().await;
    let survivors: Vec<Meta> = metas
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != dead)
        .map(|(_, m)| m.clone())
        .collect();
    let (new_leader, _) = write_to_leader(&survivors, create("after-failover")).await;
    assert_ne!(new_leader.node_id(), leader.node_id());
    for meta in &survivors {
        eventually_has(meta, "after-failover").await;
    }

    for meta in &survivors {
        meta.shutdown().await;
    }
    for s in &servers {
        s.shutdown(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn a_silent_peer_is_detected_by_the_keepalive() {
    // Authenticates, then reads everything and answers nothing (not even pings): a hung
    // process or a half-open TCP connection.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let pings = Arc::new(AtomicUsize::new(0));
    tokio::spawn({
        let pings = pings.clone();
        async move {
            let (s, _) = listener.accept().await.unwrap();
            let (r, mut w) = s.into_split();
            let mut r = FrameReader::new(r);
            let nonce = auth::new_nonce();
            send(
                &mut w,
                Frame::new(
                    FrameType::AuthChallenge,
                    0,
                    auth::encode_challenge(&nonce, "srv"),
                ),
            )
            .await;
            let _resp = r.next().await.unwrap().unwrap();
            send(&mut w, Frame::new(FrameType::AuthOk, 0, Bytes::new())).await;
            while let Ok(Some(f)) = r.next().await {
                if f.kind == FrameType::Ping {
                    pings.fetch_add(1, Ordering::SeqCst);
                }
            }
        }
    });
    let c = PeerClient::new("cli", "srv", addr.to_string(), secret());
    let start = Instant::now();
    match c
        .call_timeout(Opcode::Consume, Bytes::new(), Duration::from_secs(60))
        .await
    {
        Err(RpcError::Disconnected(m)) => assert!(m.contains("no traffic"), "{m}"),
        other => panic!("{other:?}"),
    }
    let took = start.elapsed();
    assert!(
        took >= client::DEAD_AFTER && took < client::DEAD_AFTER + Duration::from_secs(3),
        "{took:?}"
    );
    assert!(
        pings.load(Ordering::SeqCst) >= 5,
        "the client pinged while waiting"
    );
    assert!(!c.is_connected());
}

mod tls {
    //! Mutual TLS on the cluster port (SPEC §4.5) with certificates made by the test.
    use super::*;
    use crate::tls::{ReloadingTls, TlsFiles, TlsRole};
    use narad_tests::certs::{CertFiles, TestCa};

    fn load(f: &CertFiles) -> Arc<ReloadingTls> {
        ReloadingTls::load(
            TlsFiles {
                cert: f.cert.clone(),
                key: f.key.clone(),
                ca: Some(f.ca.clone()),
            },
            TlsRole::ClusterMutual,
        )
        .unwrap()
    }

    fn auth(f: &CertFiles) -> ClusterAuth {
        ClusterAuth::new(secret(), Some(load(f)))
    }

    async fn tls_server(f: &CertFiles) -> RpcServer {
        RpcServer::bind("127.0.0.1:0", "srv", auth(f), echo())
            .await
            .unwrap()
    }

    async fn call(srv: &RpcServer, auth: ClusterAuth) -> Result<RpcReply, RpcError> {
        PeerClient::new("cli", "srv", srv.local_addr().to_string(), auth)
            .call(Opcode::Ack, Bytes::new())
            .await
    }

    /// The status of an `Ack` through an existing client (its connection, if it has one).
    async fn ack_status(c: &PeerClient) -> u16 {
        c.call(Opcode::Ack, Bytes::new()).await.unwrap().status
    }

    #[tokio::test]
    async fn requests_flow_only_between_holders_of_the_ca() {
        let dir = tempfile::tempdir().unwrap();
        let ca = TestCa::new("narad-ca");
        let srv = tls_server(&ca.issue(dir.path(), "srv", &["127.0.0.1"])).await;
        let good = ca.issue(dir.path(), "cli", &["127.0.0.1"]);
        assert_eq!(call(&srv, auth(&good)).await.unwrap().status, 200);
        let s = srv.stats();
        assert_eq!((s.authenticated, s.auth_failures), (1, 0));

        // A client certificate from another CA: refused by the server.
        let evil = TestCa::new("evil-ca");
        let stranger = evil.issue(dir.path(), "stranger", &["127.0.0.1"]);
        assert!(
            matches!(call(&srv, auth(&stranger)).await, Err(RpcError::Auth(_))),
            "a foreign client certificate was accepted"
        );
        // The right secret over plaintext: no TLS, no entry.
        assert!(call(&srv, secret().into()).await.is_err());
        assert_eq!(srv.stats().authenticated, 1);

        // The server's certificate must chain to the client's CA and name the address.
        let impostor = tls_server(&evil.issue(dir.path(), "impostor", &["127.0.0.1"])).await;
        assert!(matches!(
            call(&impostor, auth(&good)).await,
            Err(RpcError::Auth(_))
        ));
        let misnamed = tls_server(&ca.issue(dir.path(), "misnamed", &["other.example"])).await;
        assert!(matches!(
            call(&misnamed, auth(&good)).await,
            Err(RpcError::Auth(_))
        ));
        assert_eq!(
            impostor.stats().authenticated + misnamed.stats().authenticated,
            0
        );
        for s in [srv, impostor, misnamed] {
            s.shutdown(Duration::from_secs(1)).await;
        }
    }

    #[tokio::test]
    async fn the_proof_is_bound_to_the_tls_session() {
        let dir = tempfile::tempdir().unwrap();
        let ca = TestCa::new("narad-ca");
        let srv = tls_server(&ca.issue(dir.path(), "srv", &["127.0.0.1"])).await;
        let client = load(&ca.issue(dir.path(), "cli", &["127.0.0.1"]));
        let addr = srv.local_addr().to_string();
        for bound in [false, true] {
            let tcp = TcpStream::connect(&addr).await.unwrap();
            let split = transport::connect_tls(tcp, &addr, &client).await.unwrap();
            assert_eq!(split.binding.len(), transport::BINDING_LEN);
            let mut r = FrameReader::new(split.read);
            let mut w = split.write;
            let ch = r.next().await.unwrap().unwrap();
            let (nonce, _) = auth::decode_challenge(&ch.payload).unwrap();
            let proof = if bound {
                secret().bound_proof(&nonce, "cli", &split.binding)
            } else {
                // What a relay that terminated TLS would have: the plaintext proof.
                secret().proof(&nonce, "cli")
            };
            let resp = Frame::new(
                FrameType::AuthResponse,
                0,
                auth::encode_response("cli", &proof),
            );
            w.write_all(&resp.encode().unwrap()).await.unwrap();
            w.flush().await.unwrap();
            let verdict = r.next().await.unwrap().unwrap();
            let want = if bound {
                FrameType::AuthOk
            } else {
                FrameType::Error
            };
            assert_eq!(verdict.kind, want, "bound = {bound}");
        }
        srv.shutdown(Duration::from_secs(1)).await;
    }

    #[tokio::test]
    async fn rotated_certificates_are_used_for_new_connections() {
        let dir = tempfile::tempdir().unwrap();
        let old_ca = TestCa::new("ca-1");
        let srv_files = old_ca.issue(dir.path(), "srv", &["127.0.0.1"]);
        let srv_tls = load(&srv_files);
        let srv = RpcServer::bind(
            "127.0.0.1:0",
            "srv",
            ClusterAuth::new(secret(), Some(srv_tls.clone())),
            echo(),
        )
        .await
        .unwrap();
        let addr = srv.local_addr().to_string();
        let old_client = PeerClient::new(
            "old",
            "srv",
            addr.clone(),
            auth(&old_ca.issue(dir.path(), "old", &["127.0.0.1"])),
        );
        assert_eq!(ack_status(&old_client).await, 200);

        // cert-manager rotates the Secret: a new CA and a new server certificate, same paths.
        let new_ca = TestCa::new("ca-2");
        new_ca.issue(dir.path(), "srv", &["127.0.0.1"]);
        srv_tls.check_now();
        let new_client = auth(&new_ca.issue(dir.path(), "new", &["127.0.0.1"]));
        assert_eq!(call(&srv, new_client).await.unwrap().status, 200);
        // The established session goes on; a new one with the old CA is refused.
        assert_eq!(ack_status(&old_client).await, 200);
        old_client.close();
        let stale = auth(&old_ca.issue(dir.path(), "old2", &["127.0.0.1"]));
        assert!(matches!(call(&srv, stale).await, Err(RpcError::Auth(_))));

        // A rotation that leaves broken files keeps the last good certificates.
        std::fs::write(&srv_files.cert, "-----BEGIN CERTIFICATE-----\ngarbage\n").unwrap();
        srv_tls.check_now();
        let new_client = auth(&new_ca.issue(dir.path(), "new2", &["127.0.0.1"]));
        assert_eq!(call(&srv, new_client).await.unwrap().status, 200);
        srv.shutdown(Duration::from_secs(1)).await;
    }
}
