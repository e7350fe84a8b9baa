//! A node started in this process (`node::start` on port 0): the test level between the unit
//! tests and the black-box suite, where a test can look at the node's services directly while
//! it talks HTTP to it.

use std::time::Duration;

use narad::config::Config;
use narad_api::{Client, CreateTopicRequest};

fn config(dir: &std::path::Path) -> Config {
    let mut c = Config {
        dev: true,
        ..Config::default()
    };
    c.security.enabled = false;
    c.cluster.node_id = "in-process".into();
    c.http.addr = "127.0.0.1:0".into();
    c.storage.data_dir = dir.join("data");
    c
}

/// A hang guard only: none of these steps takes more than a fraction of it.
const GUARD: Duration = Duration::from_secs(30);

/// The ordered shutdown, which must end (within the hang guard) and succeed.
async fn stop(running: narad::node::Running) {
    tokio::time::timeout(GUARD, running.shutdown())
        .await
        .expect("shutdown ends")
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_in_process_serves_stops_in_order_and_restarts_on_its_data() {
    let dir = tempfile::tempdir().unwrap();
    let running = narad::node::start(config(dir.path())).await.unwrap();
    let app = running.app.clone();
    assert!(app.health.startup_done());
    // Standalone: admitted, registered and leader at once.
    tokio::time::timeout(GUARD, async {
        while !app.health.is_ready() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("ready");

    let client = Client::new(&format!("http://{}", running.addr), None).unwrap();
    client
        .create_topic(&CreateTopicRequest {
            name: "orders".into(),
            partitions: Some(3),
            ..Default::default()
        })
        .await
        .unwrap();
    for i in 0..50 {
        client
            .produce("orders", format!("m{i}"), None, None)
            .await
            .unwrap();
    }
    // Half of them consumed and acked; the other half stays for after the restart.
    for _ in 0..25 {
        let m = client
            .consume("orders", Some(Duration::from_secs(5)), None)
            .await
            .unwrap()
            .expect("a message");
        client
            .ack("orders", m.receipt_handle.as_deref().unwrap())
            .await
            .unwrap();
    }

    // The ordered shutdown ends every task it started and releases the data dir; the
    // services see the signal.
    let health = app.health.clone();
    stop(running).await;
    assert!(health.is_shutting_down());
    assert!(health.is_stopping());
    assert_eq!(app.wal.outstanding(), 0, "the WAL drained before the stop");
    drop(app);

    // The same data dir opens again at once (the lock went with the stopped node), and the
    // 25 messages not acked are still there, each once.
    let running = narad::node::start(config(dir.path())).await.unwrap();
    let client = Client::new(&format!("http://{}", running.addr), None).unwrap();
    let mut left = std::collections::BTreeSet::new();
    while let Some(m) = client
        .consume("orders", Some(Duration::from_millis(500)), None)
        .await
        .unwrap()
    {
        assert!(
            left.insert((m.partition, m.offset)),
            "delivered twice: {m:?}"
        );
        client
            .ack("orders", m.receipt_handle.as_deref().unwrap())
            .await
            .unwrap();
    }
    assert_eq!(left.len(), 25);
    stop(running).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_node_on_the_same_data_dir_is_refused_while_the_first_runs() {
    let dir = tempfile::tempdir().unwrap();
    let running = narad::node::start(config(dir.path())).await.unwrap();
    let err = match narad::node::start(config(dir.path())).await {
        Ok(_) => panic!("two nodes on one data dir"),
        Err(e) => format!("{e:#}"),
    };
    assert!(err.contains("in use by another narad process"), "{err}");
    stop(running).await;
}

/// The node-RPC adapter over the same services as the HTTP one: what a peer's `Produce`
/// stores, a client consumes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_node_rpc_adapter_serves_from_the_same_services() {
    use bytes::Bytes;
    use narad::cluster::wire::{ForwardProduce, ForwardRecord};
    use narad::rpc::{Caller, Opcode, RpcHandler};

    let dir = tempfile::tempdir().unwrap();
    let running = narad::node::start(config(dir.path())).await.unwrap();
    let client = Client::new(&format!("http://{}", running.addr), None).unwrap();
    client
        .create_topic(&CreateTopicRequest {
            name: "relay".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    let topic_id = running.app.meta.view().topics["relay"].id;
    let peer = Caller {
        node_id: "peer".into(),
        proven: true,
    };
    let rpc = narad::node_rpc::NodeRpc::new();
    // Not given the services yet: the node is starting.
    let r = rpc
        .handle(&peer, Opcode::GetTopic as u8, Bytes::new())
        .await;
    assert_eq!(r.status, 503);
    rpc.set_app(running.app.clone());
    // An opcode this build does not know: the answer callers read as "peer too old".
    assert!(rpc
        .handle(&peer, 250, Bytes::new())
        .await
        .is_unsupported(250));
    // A body that is not the opcode's encoding.
    let r = rpc
        .handle(&peer, Opcode::Produce as u8, Bytes::from_static(b"junk"))
        .await;
    assert_eq!(r.status, 400, "{:?}", String::from_utf8_lossy(&r.body));
    // A draining peer's forwarded produce (one record pinned to partition 1).
    let forward = |payload: &'static [u8], attrs: Option<Bytes>| {
        ForwardProduce {
            topic_id,
            records: vec![ForwardRecord {
                partition: 1,
                pinned: true,
                key: None,
                payload: Bytes::from_static(payload),
                attrs,
            }],
        }
        .encode()
    };
    // It is stored here like a produce received here.
    let body = forward(b"relayed", None);
    let r = rpc.handle(&peer, Opcode::Produce as u8, body).await;
    assert_eq!(r.status, 202, "{:?}", String::from_utf8_lossy(&r.body));
    assert_eq!(&r.body[..], br#"{"accepted":1}"#);
    let m = client
        .consume("relay", Some(Duration::from_secs(5)), Some(1))
        .await
        .unwrap()
        .expect("the relayed message");
    assert_eq!(m.payload.get(), "\"relayed\"");
    assert_eq!(m.attributes, None);

    // With attributes: `ProduceAttrs` (37) stores them, `CommitProduceBatchAttrs` (36)
    // commits them into the owned partition; the plain opcodes refuse that shape.
    let mut block = narad::attrs::Builder::default();
    block.push("traceparent", "00-1-2-01").unwrap();
    let block = block.finish();
    let body = forward(b"forwarded", block.clone());
    let r = rpc.handle(&peer, Opcode::Produce as u8, body.clone()).await;
    assert_eq!(r.status, 400, "{:?}", String::from_utf8_lossy(&r.body));
    let r = rpc.handle(&peer, Opcode::ProduceAttrs as u8, body).await;
    assert_eq!(r.status, 202, "{:?}", String::from_utf8_lossy(&r.body));
    let body = narad::cluster::wire::CommitBatch {
        topic_id,
        partition: 0,
        records: vec![narad::cluster::wire::CommitRecord {
            key: Some(Bytes::from_static(b"k")),
            payload: Bytes::from_static(b"committed"),
            attrs: block,
        }],
    }
    .encode();
    let r = rpc
        .handle(&peer, Opcode::CommitProduceBatch as u8, body.clone())
        .await;
    assert_eq!(r.status, 400, "{:?}", String::from_utf8_lossy(&r.body));
    let r = rpc
        .handle(&peer, Opcode::CommitProduceBatchAttrs as u8, body)
        .await;
    assert_eq!(r.status, 200, "{:?}", String::from_utf8_lossy(&r.body));
    let mut seen = Vec::new();
    while seen.len() < 2 {
        let m = client
            .consume("relay", Some(Duration::from_secs(5)), None)
            .await
            .unwrap()
            .unwrap_or_else(|| panic!("the message with attributes; seen {seen:?}"));

        seen.push((m.payload.get().to_string(), m.attributes.unwrap()));
    }
    seen.sort();
    assert_eq!(seen[0].0, "\"committed\"");
    assert_eq!(seen[1].0, "\"forwarded\"");
    for (_, a) in &seen {
        assert_eq!(a["traceparent"], "00-1-2-01");
    }
    stop(running).await;
}
