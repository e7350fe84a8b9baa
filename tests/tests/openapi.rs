//! The OpenAPI document (`GET /v1/openapi.json`, kept as `api/openapi.json`): served without
//! credentials, equal to the repository's copy, and a true description of the server: a tour
//! over every operation, with successes and the usual refusals, each answer checked against
//! the document by the harness (`narad_tests::openapi`), ending with every operation met.

use std::collections::BTreeSet;

use narad_tests::*;

const ROOT_PW: &str = "openapi-root-pw";

#[tokio::test]
async fn the_document_is_served_without_credentials_and_is_the_kept_one() {
    let server = Server::start(ServerOpts::secured(ROOT_PW)).await;
    let anon = Http::new(server.url());
    let r = anon.get("/v1/openapi.json").await;
    r.expect(200);
    assert_eq!(r.header("content-type"), Some("application/json"));
    assert_eq!(&r.json(), openapi::document(), "served = api/openapi.json");
    let doc = r.json();
    assert_eq!(doc["openapi"], "3.1.0");
    // Everything else under /v1 still needs credentials.
    anon.get("/v1/topics").await.expect_error(401);
}

/// Every operation in the document, by `operationId`.
fn operations() -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for item in openapi::document()["paths"].as_object().unwrap().values() {
        for op in item.as_object().unwrap().values() {
            out.insert(op["operationId"].as_str().unwrap().to_string());
        }
    }
    out
}

#[tokio::test]
async fn every_operation_answers_as_the_document_declares() {
    let server = Server::start(ServerOpts::secured(ROOT_PW)).await;
    let anon = Http::new(server.url());
    let root = anon.as_user("admin", ROOT_PW);

    // System: probes, metrics, the document.
    anon.get("/healthz").await.expect(200);
    anon.get("/readyz").await.expect(200);
    anon.get("/metrics").await.expect(200);
    anon.get("/v1/openapi.json").await.expect(200);

    // Refusals every /v1 route shares: no credentials, wrong method, unknown route.
    anon.get("/v1/topics").await.expect_error(401);
    root.request(Method::PUT, "/v1/topics")
        .send()
        .await
        .expect_error(405);
    root.get("/v1/nowhere").await.expect_error(404);

    // Topics.
    root.create_topic(&json!({"name": "tour", "partitions": 3}))
        .await;
    root.create_topic(&json!({"name": "tour-dlq", "partitions": 3}))
        .await;
    root.create_topic(&json!({"name": "tour-child", "partitions": 3}))
        .await;
    root.post_json("/v1/topics", &json!({"name": "tour"}))
        .await
        .expect_error(409);
    root.post_json("/v1/topics", &json!({"name": "bad name!"}))
        .await
        .expect_error(400);
    root.get("/v1/topics?limit=2").await.expect(200);
    root.get("/v1/topics?limit=0").await.expect_error(400);
    root.get("/v1/topics/tour").await.expect(200);
    root.get("/v1/topics/tour?partition=1").await.expect(200);
    root.get("/v1/topics/missing").await.expect_error(404);
    root.patch_json(
        "/v1/topics/tour",
        &json!({"dead_letter": {"topic": "tour-dlq", "max_deliveries": 1}}),
    )
    .await
    .expect(200);
    root.patch_json("/v1/topics/tour", &json!({}))
        .await
        .expect_error(400);

    // Messages: produce, batch, consume (one, a batch, nothing, replay), ack, extend, nack.
    root.produce("tour", "key=k1", "one").await.expect(202);
    root.request(Method::POST, "/v1/topics/tour/produce")
        .header("idempotency-key", "tour-1")
        .header("narad-attr-origin", "tour")
        .body("two")
        .send()
        .await
        .expect(202);
    root.produce("tour", "", "").await.expect_error(400);
    root.produce("missing", "", "x").await.expect_error(404);
    root.produce_batch(
        "tour",
        &json!({"messages": [{"payload": {"n": 1}}, {"payload": "dGhyZWU=", "payload_encoding": "base64", "key": "k2"}]}),
    )
    .await
    .expect(202);
    root.produce_batch("tour", &json!({"messages": []}))
        .await
        .expect_error(400);
    root.wait_total_visible("tour", 4).await;
    let m = root.consume_msg("tour", "wait=1s").await;
    root.ack("tour", m.handle(), Some("true")).await.expect(204);
    root.ack("tour", m.handle(), None).await.expect(204);
    root.ack("tour", m.handle(), None).await.expect_error(410);
    root.ack("tour", "garbage", None).await.expect_error(400);
    let batch = root.consume_batch("tour", "max=10&wait=1s").await;
    assert!(!batch.is_empty());
    let handles: Vec<&str> = batch.iter().map(|m| m.handle()).collect();
    root.ack_batch("tour", Some("0"), &handles)
        .await
        .expect(200);
    root.consume("tour", "max=0").await.expect_error(400);
    let replay = root.consume("tour", "partition=0&offset=0").await;
    assert!(matches!(replay.status, 200 | 204), "{}", replay.describe());
    root.consume("tour", "offset=0").await.expect_error(400);
    // Drain: nacked messages come back; leave them to the dead-letter topic (1 delivery).
    root.drain("tour", "wait=0").await;
    root.consume_none("tour", "wait=0").await;

    // Queue administration.
    root.request(Method::POST, "/v1/topics/tour/pause")
        .send()
        .await
        .expect(200);
    root.request(Method::POST, "/v1/topics/tour/resume")
        .send()
        .await
        .expect(200);
    root.request(Method::POST, "/v1/topics/tour/purge")
        .send()
        .await
        .expect(200);
    root.request(Method::POST, "/v1/topics/tour/seek")
        .json(&json!({"timestamp": 0}))
        .send()
        .await
        .expect(200);
    root.request(Method::POST, "/v1/topics/tour/seek")
        .json(&json!({"offset": 1}))
        .send()
        .await
        .expect_error(400);
    root.request(Method::POST, "/v1/topics/tour-dlq/redrive?to=tour")
        .send()
        .await
        .expect(200);
    root.request(Method::POST, "/v1/topics/missing/pause")
        .send()
        .await
        .expect_error(404);

    // Children.
    root.post_json("/v1/topics/tour/children", &json!({"child": "tour-child"}))
        .await
        .expect(200);
    root.post_json("/v1/topics/tour/children", &json!({"child": "tour-child"}))
        .await
        .expect_error(409);
    root.get("/v1/topics/tour/children").await.expect(200);
    root.delete("/v1/topics/tour/children/tour-child")
        .await
        .expect(204);
    root.delete("/v1/topics/tour/children/tour-child")
        .await
        .expect_error(404);

    // Users, grants, quotas, passwords; a user without grants is refused (403).
    root.post_json(
        "/v1/users",
        &json!({"username": "tourist", "password": "tourist-pw", "grants": [{"action": "consume", "patterns": ["tour"]}]}),
    )
    .await
    .expect(201);
    root.post_json(
        "/v1/users",
        &json!({"username": "tourist", "password": "x"}),
    )
    .await
    .expect_error(409);
    root.get("/v1/users").await.expect(200);
    root.get("/v1/users/tourist").await.expect(200);
    root.get("/v1/users/nobody").await.expect_error(404);
    root.request(Method::PUT, "/v1/users/tourist/grants")
        .json(&json!({"grants": []}))
        .send()
        .await
        .expect(200);
    root.request(Method::PUT, "/v1/users/tourist/quotas")
        .json(&json!({"produce_msgs_per_s": 100}))
        .send()
        .await
        .expect(200);
    let tourist = anon.as_user("tourist", "tourist-pw");
    tourist.get("/v1/users").await.expect_error(403);
    tourist.produce("tour", "", "x").await.expect_error(403);
    tourist
        .request(Method::PUT, "/v1/users/tourist/password")
        .json(&json!({"current_password": "tourist-pw", "new_password": "tourist-pw2"}))
        .send()
        .await
        .expect(204);
    root.delete("/v1/users/tourist").await.expect(204);

    // Cluster.
    root.get("/v1/cluster/members").await.expect(200);
    root.get("/v1/cluster/moves").await.expect(200);
    root.request(Method::POST, "/v1/cluster/members/nobody/decommission")
        .send()
        .await
        .expect_error(404);
    root.delete("/v1/cluster/members/nobody/decommission")
        .await
        .expect_error(404);

    // Deletes last.
    root.delete("/v1/topics/tour-child").await.expect(204);
    root.delete("/v1/topics/tour-child").await.expect_error(404);

    let met: BTreeSet<String> = openapi::seen().into_iter().map(|(id, _)| id).collect();
    let all = operations();
    let missing: Vec<&String> = all.difference(&met).collect();
    assert!(
        missing.is_empty(),
        "operations the tour did not meet: {missing:?}"
    );
    let answers = openapi::seen().len();
    println!(
        "openapi: {} operations met with {answers} distinct (operation, status) answers",
        met.len()
    );
}
