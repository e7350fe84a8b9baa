//! The local delivery core over real partitions: leasing into a bounded answer, settling by
//! receipt handle.

use std::sync::Arc;

use bytes::Bytes;
use narad_meta::{MetaState, Topic};
use narad_storage::{LogConfig, NewRecord};

use super::render::Answer;
use super::*;
use crate::metrics::Metrics;
use crate::partition::Registry;

/// A registry holding topic `t` (id 1) with `owners.len()` partitions, those of `"me"` open,
/// each with `per_partition` committed records `p<partition>-<i>`.
fn setup(owners: &[&str], per_partition: usize) -> (tempfile::TempDir, Topic, Arc<TopicRuntime>) {
    let dir = tempfile::tempdir().unwrap();
    let reg = Registry::new(
        dir.path().join("topics"),
        LogConfig::default(),
        Arc::new(Metrics::new()),
    )
    .unwrap();
    let topic = crate::test_support::topic(1, "t", owners);
    let mut view = MetaState::default();
    view.topics.insert("t".into(), Arc::new(topic.clone()));
    view.next_topic_id = 2;
    reg.reconcile(&view, "me").unwrap();
    let rt = reg.topic(1).unwrap();
    for part in rt.partitions().iter() {
        let batch: Vec<NewRecord> = (0..per_partition)
            .map(|i| NewRecord {
                key: None,
                payload: Bytes::from(format!("p{}-{i}", part.index)),
                attrs: None,
            })
            .collect();
        part.commit_batch(&batch).unwrap();
    }
    (dir, topic, rt)
}

/// The messages of a rendered answer (one object or a batch).
fn messages(body: &[u8]) -> Vec<serde_json::Value> {
    let v: serde_json::Value = serde_json::from_slice(body).unwrap();
    match v.get("messages") {
        Some(m) => m.as_array().unwrap().clone(),
        None => vec![v],
    }
}

fn handle(m: &serde_json::Value) -> ReceiptHandle {
    m["receipt_handle"].as_str().unwrap().parse().unwrap()
}

#[test]
fn a_batch_takes_up_to_max_from_every_local_partition_and_no_more() {
    let (_d, topic, rt) = setup(&["me", "other", "me"], 2);
    let mut a = Answer::new(true);
    lease_local(&topic, &rt, None, 3, &mut a, None, &mut Vec::new()).unwrap();
    let got = messages(&a.finish());
    assert_eq!(got.len(), 3);
    // Only partitions 0 and 2 are here.
    assert!(got.iter().all(|m| m["partition"] != 1), "{got:?}");
    // Every handle names its message.
    for m in &got {
        let h = handle(m);
        assert_eq!(u64::from(h.partition), m["partition"].as_u64().unwrap());
        assert_eq!(h.offset, m["offset"].as_u64().unwrap());
    }
    // One of the four is left, and then nothing.
    let mut rest = Answer::new(true);
    lease_local(&topic, &rt, None, 100, &mut rest, None, &mut Vec::new()).unwrap();
    assert_eq!(messages(&rest.finish()).len(), 1);
    let mut none = Answer::new(true);
    lease_local(&topic, &rt, None, 100, &mut none, None, &mut Vec::new()).unwrap();
    assert!(none.is_empty());
}

#[test]
fn a_pinned_lease_reads_only_its_partition() {
    let (_d, topic, rt) = setup(&["me", "me"], 3);
    let mut a = Answer::new(true);
    lease_local(&topic, &rt, Some(1), 100, &mut a, None, &mut Vec::new()).unwrap();
    let got = messages(&a.finish());
    assert_eq!(got.len(), 3);
    assert!(got.iter().all(|m| m["partition"] == 1), "{got:?}");
}

#[test]
fn a_message_that_does_not_fit_the_answer_is_handed_back_at_once() {
    let (_d, topic, rt) = setup(&["me"], 3);
    // A budget that holds one message: the second is leased, does not fit, and goes back.
    let mut a = Answer::with_budget(true, 10);
    lease_local(&topic, &rt, None, 100, &mut a, None, &mut Vec::new()).unwrap();
    assert_eq!(messages(&a.finish()).len(), 1);
    let part = rt.partition(0).unwrap();
    assert_eq!(
        part.queue_stats().1,
        1,
        "only the carried message is leased"
    );
    let mut b = Answer::new(true);
    lease_local(&topic, &rt, None, 100, &mut b, None, &mut Vec::new()).unwrap();
    let got = messages(&b.finish());
    assert_eq!(
        got.iter()
            .map(|m| m["offset"].as_u64().unwrap())
            .collect::<Vec<_>>(),
        vec![1, 2]
    );
}

#[test]
fn settling_by_handle_acks_once_extends_and_nacks_back_to_the_queue() {
    let (_d, topic, rt) = setup(&["me"], 2);
    let mut a = Answer::new(true);
    lease_local(&topic, &rt, None, 2, &mut a, None, &mut Vec::new()).unwrap();
    let got = messages(&a.finish());
    let (first, second) = (handle(&got[0]), handle(&got[1]));

    assert_eq!(settle_local(&topic, &rt, first, SettleKind::Extend), Ok(()));
    assert_eq!(settle_local(&topic, &rt, first, SettleKind::Ack), Ok(()));
    assert_eq!(
        settle_local(&topic, &rt, first, SettleKind::Ack),
        Err(Unsettled::Stale("handle no longer valid"))
    );
    // A nacked message is leased again, under a new handle; the old one is stale.
    assert_eq!(settle_local(&topic, &rt, second, SettleKind::Nack), Ok(()));
    let mut again = Answer::new(false);
    lease_local(&topic, &rt, None, 1, &mut again, None, &mut Vec::new()).unwrap();
    let redelivered = handle(&messages(&again.finish())[0]);
    assert_eq!(redelivered.offset, second.offset);
    assert_ne!(redelivered.nonce, second.nonce);
    assert_eq!(
        settle_local(&topic, &rt, second, SettleKind::Ack),
        Err(Unsettled::Stale("handle no longer valid"))
    );
    assert_eq!(
        settle_local(&topic, &rt, redelivered, SettleKind::Ack),
        Ok(())
    );
}

#[test]
fn a_handle_of_a_partition_not_here_or_not_in_the_topic_is_stale() {
    let (_d, topic, rt) = setup(&["me", "other"], 1);
    for partition in [1, 2, u32::MAX] {
        let h = ReceiptHandle {
            partition,
            offset: 0,
            nonce: 1,
        };
        assert_eq!(
            settle_local(&topic, &rt, h, SettleKind::Ack),
            Err(Unsettled::Stale("no such partition")),
            "{h}"
        );
    }
}

#[test]
fn a_batch_of_one_is_clamped_and_a_single_ask_wants_one() {
    let ask = |max| ConsumeAsk {
        partition: None,
        max,
        wait: Duration::ZERO,
    };
    assert_eq!(ask(None).want(), 1);
    assert_eq!(ask(Some(0)).want(), 1);
    assert_eq!(ask(Some(7)).want(), 7);
    assert_eq!(ask(Some(1000)).want(), MAX_BATCH as usize);
}

#[test]
fn a_nack_counts_the_redelivery_and_a_release_of_an_unused_lease_does_not() {
    let (_d, topic, rt) = setup(&["me"], 1);
    let lease_one = || {
        let mut a = Answer::new(false);
        lease_local(&topic, &rt, None, 1, &mut a, None, &mut Vec::new()).unwrap();
        messages(&a.finish()).remove(0)
    };
    let m = lease_one();
    assert_eq!(m["delivery_count"], 1);
    assert_eq!(
        settle_local(&topic, &rt, handle(&m), SettleKind::Nack),
        Ok(())
    );
    let m = lease_one();
    assert_eq!(m["delivery_count"], 2);
    // A node that prefetched it releases it unused: back at once, not counted.
    assert_eq!(
        settle_local(&topic, &rt, handle(&m), SettleKind::Release),
        Ok(())
    );
    let m = lease_one();
    assert_eq!(m["delivery_count"], 2);
    assert_eq!(
        settle_local(&topic, &rt, handle(&m), SettleKind::Release),
        Ok(())
    );
    assert_eq!(
        settle_local(&topic, &rt, handle(&m), SettleKind::Release),
        Err(Unsettled::Stale("handle no longer valid"))
    );
}
