//! Reconciler tests against a mocked API server (kube-rs's pattern): `ApiServerVerifier`
//! answers the requests the reconciler makes, in the order the scenario expects, and fails
//! on any other; a timeout catches calls that never came.

use std::sync::Arc;
use std::time::Duration;

use http::{Request, Response};
use kube::client::Body;
use serde_json::json;

use crate::crd::{Grant, Topic};
use crate::reconcile::Context;

type Handle = tower_test::mock::Handle<Request<Body>, Response<Body>>;

/// Plays the API server for one test.
pub struct ApiServerVerifier(Handle);

/// A context whose client talks to the returned verifier.
pub fn test_context() -> (Arc<Context>, ApiServerVerifier) {
    let (svc, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let client = kube::Client::new(svc, "default");
    (Arc::new(Context::new(client)), ApiServerVerifier(handle))
}

/// A Topic `orders` in `default` for cluster `prod`.
pub fn topic() -> Topic {
    serde_json::from_value(json!({
        "apiVersion": "narad.io/v1alpha1", "kind": "Topic",
        "metadata": {"name": "orders", "namespace": "default", "uid": "t-1", "generation": 1,
                     "resourceVersion": "1"},
        "spec": {"clusterRef": {"name": "prod"}, "partitions": 3},
    }))
    .unwrap()
}

/// A Grant `billing-produce` (finalized) for User `billing` of cluster `prod`.
pub fn grant() -> Grant {
    serde_json::from_value(json!({
        "apiVersion": "narad.io/v1alpha1", "kind": "Grant",
        "metadata": {"name": "billing-produce", "namespace": "default", "uid": "g-1",
                     "generation": 1, "resourceVersion": "1", "finalizers": ["narad.io/finalizer"]},
        "spec": {"clusterRef": {"name": "prod"}, "user": "billing", "action": "produce",
                 "patterns": ["orders"]},
    }))
    .unwrap()
}

fn respond(status: u16, body: serde_json::Value) -> Response<Body> {
    Response::builder()
        .status(status)
        .body(Body::from(serde_json::to_vec(&body).unwrap()))
        .unwrap()
}

fn not_found(what: &str) -> serde_json::Value {
    json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
           "message": format!("{what} not found"), "reason": "NotFound", "code": 404})
}

impl ApiServerVerifier {
    /// The next request; asserts its method and path (without query).
    async fn expect(
        &mut self,
        method: &str,
        path: &str,
    ) -> (
        Request<Body>,
        tower_test::mock::SendResponse<Response<Body>>,
    ) {
        let (req, send) = tokio::time::timeout(Duration::from_secs(2), self.0.next_request())
            .await
            .unwrap_or_else(|_| panic!("timed out waiting for {method} {path}"))
            .expect("a request");
        assert_eq!(req.method().as_str(), method, "method of {}", req.uri());
        assert_eq!(req.uri().path(), path);
        (req, send)
    }

    async fn body(req: Request<Body>) -> serde_json::Value {
        let bytes = req.into_body().collect_bytes().await.unwrap();
        serde_json::from_slice(&bytes).unwrap()
    }

    /// A new Topic: the finalizer is added first, and nothing else happens in that pass.
    pub async fn topic_gets_finalizer(mut self, t: &Topic) {
        let (req, send) = self
            .expect(
                "PATCH",
                "/apis/narad.io/v1alpha1/namespaces/default/topics/orders",
            )
            .await;
        let patch = Self::body(req).await;
        assert_eq!(patch[1]["op"], "add");
        assert_eq!(patch[1]["value"], json!(["narad.io/finalizer"]));
        let mut out = serde_json::to_value(t).unwrap();
        out["metadata"]["finalizers"] = json!(["narad.io/finalizer"]);
        send.send_response(respond(200, out));
    }

    /// A finalized Topic whose NaradCluster does not exist: the cluster is looked up, then
    /// status says `ClusterNotFound`; the broker is never called.
    pub async fn topic_waits_for_cluster(mut self, t: &Topic) {
        let (_, send) = self
            .expect(
                "GET",
                "/apis/narad.io/v1alpha1/namespaces/default/naradclusters/prod",
            )
            .await;
        send.send_response(respond(404, not_found("naradclusters.narad.io \"prod\"")));
        let (req, send) = self
            .expect(
                "PATCH",
                "/apis/narad.io/v1alpha1/namespaces/default/topics/orders/status",
            )
            .await;
        let patch = Self::body(req).await;
        let conds = patch["status"]["conditions"].as_array().unwrap();
        let ready = conds.iter().find(|c| c["type"] == "Ready").unwrap();
        assert_eq!(ready["status"], "False");
        assert_eq!(ready["reason"], "ClusterNotFound");
        let synced = conds.iter().find(|c| c["type"] == "Synced").unwrap();
        assert_eq!(synced["reason"], "ClusterNotFound");
        send.send_response(respond(200, serde_json::to_value(t).unwrap()));
    }

    /// A Topic being deleted after its NaradCluster vanished: the finalizer is released
    /// without any broker call.
    pub async fn topic_released_without_cluster(mut self, t: &Topic) {
        let (_, send) = self
            .expect(
                "GET",
                "/apis/narad.io/v1alpha1/namespaces/default/naradclusters/prod",
            )
            .await;
        send.send_response(respond(404, not_found("naradclusters.narad.io \"prod\"")));
        let (req, send) = self
            .expect(
                "PATCH",
                "/apis/narad.io/v1alpha1/namespaces/default/topics/orders",
            )
            .await;
        let patch = Self::body(req).await;
        assert_eq!(
            patch[0],
            json!({"op": "test", "path": "/metadata/finalizers/0", "value": "narad.io/finalizer"})
        );
        assert_eq!(
            patch[1],
            json!({"op": "remove", "path": "/metadata/finalizers/0"})
        );
        send.send_response(respond(200, serde_json::to_value(t).unwrap()));
    }
}

impl ApiServerVerifier {
    /// A Grant whose User does not exist: the User is looked up, then status says
    /// `WaitingForUser`; neither the cluster nor the broker is asked.
    pub async fn grant_waits_for_user(mut self, g: &Grant) {
        let (_, send) = self
            .expect(
                "GET",
                "/apis/narad.io/v1alpha1/namespaces/default/users/billing",
            )
            .await;
        send.send_response(respond(404, not_found("users.narad.io \"billing\"")));
        let (req, send) = self
            .expect(
                "PATCH",
                "/apis/narad.io/v1alpha1/namespaces/default/grants/billing-produce/status",
            )
            .await;
        let patch = Self::body(req).await;
        let conds = patch["status"]["conditions"].as_array().unwrap();
        for t in ["Ready", "Synced"] {
            let c = conds.iter().find(|c| c["type"] == t).unwrap();
            assert_eq!(
                (c["status"].as_str(), c["reason"].as_str()),
                (Some("False"), Some("WaitingForUser"))
            );
        }
        send.send_response(respond(200, serde_json::to_value(g).unwrap()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reconcile::{topic, Error};

    async fn run<F: std::future::Future<Output = ()> + Send + 'static>(
        t: Topic,
        scenario: impl FnOnce(ApiServerVerifier, Topic) -> F,
    ) -> Result<kube::runtime::controller::Action, Error> {
        let (ctx, verifier) = test_context();
        let server = tokio::spawn(scenario(verifier, t.clone()));
        let r = topic::reconcile(Arc::new(t), ctx).await;
        tokio::time::timeout(Duration::from_secs(2), server)
            .await
            .expect("scenario finished")
            .expect("scenario passed");
        r
    }

    #[tokio::test]
    async fn new_topic_gets_a_finalizer_first() {
        let r = run(
            topic(),
            |v, t| async move { v.topic_gets_finalizer(&t).await },
        )
        .await;
        assert!(r.is_ok(), "{r:?}");
    }

    #[tokio::test]
    async fn topic_without_cluster_waits() {
        let mut t = topic();
        t.metadata.finalizers = Some(vec!["narad.io/finalizer".into()]);
        let r = run(t, |v, t| async move { v.topic_waits_for_cluster(&t).await }).await;
        match r {
            Err(Error::Finalizer(e)) => assert!(e.to_string().contains("waiting"), "{e}"),
            other => panic!("expected a wait, got {other:?}"),
        }
    }

    #[tokio::test]
    async fn grant_waits_for_its_user() {
        let (ctx, verifier) = test_context();
        let g = grant();
        let server = tokio::spawn({
            let g = g.clone();
            async move { verifier.grant_waits_for_user(&g).await }
        });
        let r = crate::reconcile::grant::reconcile(Arc::new(g), ctx).await;
        tokio::time::timeout(Duration::from_secs(2), server)
            .await
            .expect("scenario finished")
            .expect("scenario passed");
        match r {
            Err(Error::Finalizer(e)) => assert!(e.to_string().contains("User billing"), "{e}"),
            other => panic!("expected a wait, got {other:?}"),
        }
    }

    #[tokio::test]
    async fn deleted_cluster_releases_dependents() {
        let mut t = topic();
        t.metadata.finalizers = Some(vec!["narad.io/finalizer".into()]);
        t.metadata.deletion_timestamp = Some(crate::reconcile::now());
        let r = run(t, |v, t| async move {
            v.topic_released_without_cluster(&t).await
        })
        .await;
        assert!(r.is_ok(), "{r:?}");
    }
}
