//! Reconciler tests against a mocked API server (kube-rs's pattern): `ApiServerVerifier`
//! answers the requests the reconciler makes, in the order the scenario expects, and fails
//! on any other; a timeout catches calls that never came.

use std::sync::Arc;
use std::time::Duration;

use http::{Request, Response};
use kube::client::Body;
use serde_json::json;

use crate::crd::{Grant, NaradCluster, Topic, User};
use crate::reconcile::Context;

type Handle = tower_test::mock::Handle<Request<Body>, Response<Body>>;

/// Plays the API server for one test.
pub struct ApiServerVerifier(Handle);

/// A context whose client talks to the returned verifier, installed with external
/// endpoints allowed (the scenarios reach test brokers through `spec.endpoint`).
pub fn test_context() -> (Arc<Context>, ApiServerVerifier) {
    test_context_with(|_| {})
}

/// [`test_context`], with `f` adjusting the context first (e.g. the operator's trusted
/// `broker_endpoint` override, or the install-wide switch turned off).
pub fn test_context_with(f: impl FnOnce(&mut Context)) -> (Arc<Context>, ApiServerVerifier) {
    let (svc, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let client = kube::Client::new(svc, "default");
    let mut ctx = Context::new(client);
    ctx.allow_external_endpoints = true;
    f(&mut ctx);
    (Arc::new(ctx), ApiServerVerifier(handle))
}

/// A NaradCluster `prod` in `default` (uid `nc-1`, finalized) with `spec`.
pub fn cluster(spec: serde_json::Value) -> NaradCluster {
    serde_json::from_value(json!({
        "apiVersion": "narad.io/v1alpha1", "kind": "NaradCluster",
        "metadata": {"name": "prod", "namespace": "default", "uid": "nc-1", "generation": 1,
                     "resourceVersion": "1", "finalizers": ["narad.io/finalizer"]},
        "spec": spec,
    }))
    .unwrap()
}

/// A User `billing` (finalized) of cluster `prod`, password in Secret `billing-password`.
pub fn user() -> User {
    serde_json::from_value(json!({
        "apiVersion": "narad.io/v1alpha1", "kind": "User",
        "metadata": {"name": "billing", "namespace": "default", "uid": "u-1", "generation": 1,
                     "resourceVersion": "1", "finalizers": ["narad.io/finalizer"]},
        "spec": {"clusterRef": {"name": "prod"},
                 "passwordSecretRef": {"name": "billing-password", "key": "password"}},
    }))
    .unwrap()
}

/// Metadata of a Secret `name`: labelled `narad.io/credentials: "true"` or not, owned (as
/// controller) by the NaradCluster of uid `owner` or not.
pub fn secret_meta(name: &str, labelled: bool, owner: Option<&str>) -> serde_json::Value {
    let mut m = json!({"name": name, "namespace": "default", "uid": format!("s-{name}"),
                       "resourceVersion": "7"});
    if labelled {
        m["labels"] = json!({"narad.io/credentials": "true"});
    }
    if let Some(uid) = owner {
        m["ownerReferences"] = json!([{"apiVersion": "narad.io/v1alpha1", "kind": "NaradCluster",
            "name": "prod", "uid": uid, "controller": true, "blockOwnerDeletion": true}]);
    }
    m
}

/// A port where nothing answers and nothing may arrive: the operator must never connect
/// (checked after the reconcile, when any connection would sit in the accept backlog).
pub struct Untouched(std::net::TcpListener);

impl Untouched {
    pub fn bind() -> Untouched {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.set_nonblocking(true).unwrap();
        Untouched(l)
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.0.local_addr().unwrap())
    }

    pub fn assert_untouched(&self) {
        match self.0.accept() {
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            other => panic!("the operator connected to a refused endpoint: {other:?}"),
        }
    }
}

/// One request a [`FakeBroker`] got.
#[derive(Debug, Clone)]
pub struct BrokerCall {
    pub method: String,
    pub path: String,
    /// The `Authorization` header.
    pub auth: Option<String>,
    pub body: serde_json::Value,
}

/// A broker that knows topic `orders` (as [`topic`] wants it, standalone, no children) and
/// accepts a child attach on it; it records every request.
pub struct FakeBroker {
    pub url: String,
    calls: Arc<std::sync::Mutex<Vec<BrokerCall>>>,
    /// TLS handshakes that failed (an HTTPS broker only).
    handshake_failures: Arc<std::sync::atomic::AtomicUsize>,
}

impl FakeBroker {
    pub async fn start() -> FakeBroker {
        let calls = Arc::new(std::sync::Mutex::new(Vec::new()));
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", l.local_addr().unwrap());
        let app = axum::Router::new()
            .fallback(fake_broker)
            .with_state(calls.clone());
        tokio::spawn(async move { axum::serve(l, app).await });
        FakeBroker {
            url,
            calls,
            handshake_failures: Default::default(),
        }
    }

    /// The same broker serving HTTPS only, with the certificate and key of `files` (which
    /// must name `127.0.0.1`), at `https://127.0.0.1:<port>`.
    pub async fn start_tls(files: &narad_tests::certs::CertFiles) -> FakeBroker {
        use tokio_rustls::rustls;
        use tokio_rustls::rustls::pki_types::pem::PemObject;
        use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
        let certs = CertificateDer::pem_file_iter(&files.cert)
            .unwrap()
            .collect::<Result<Vec<_>, _>>()
            .unwrap();
        let key = PrivateKeyDer::from_pem_file(&files.key).unwrap();
        let mut cfg = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .unwrap();
        cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
        let calls = Arc::new(std::sync::Mutex::new(Vec::new()));
        let handshake_failures = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let tcp = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("https://{}", tcp.local_addr().unwrap());
        let listener = TlsListener {
            tcp,
            acceptor: tokio_rustls::TlsAcceptor::from(Arc::new(cfg)),
            failures: handshake_failures.clone(),
        };
        let app = axum::Router::new()
            .fallback(fake_broker)
            .with_state(calls.clone());
        tokio::spawn(async move { axum::serve(listener, app).await });
        FakeBroker {
            url,
            calls,
            handshake_failures,
        }
    }

    pub fn calls(&self) -> Vec<BrokerCall> {
        self.calls.lock().unwrap().clone()
    }

    pub fn handshake_failures(&self) -> usize {
        self.handshake_failures
            .load(std::sync::atomic::Ordering::SeqCst)
    }
}

/// An HTTPS listener for `axum::serve`: connections whose TLS handshake fails are dropped
/// and counted.
struct TlsListener {
    tcp: tokio::net::TcpListener,
    acceptor: tokio_rustls::TlsAcceptor,
    failures: Arc<std::sync::atomic::AtomicUsize>,
}

impl axum::serve::Listener for TlsListener {
    type Io = tokio_rustls::server::TlsStream<tokio::net::TcpStream>;
    type Addr = std::net::SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            let Ok((tcp, addr)) = self.tcp.accept().await else {
                continue;
            };
            match self.acceptor.accept(tcp).await {
                Ok(tls) => return (tls, addr),
                Err(_) => {
                    self.failures
                        .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                }
            }
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        self.tcp.local_addr()
    }
}

async fn fake_broker(
    axum::extract::State(calls): axum::extract::State<Arc<std::sync::Mutex<Vec<BrokerCall>>>>,
    req: axum::extract::Request,
) -> (http::StatusCode, axum::Json<serde_json::Value>) {
    let (parts, body) = req.into_parts();
    let bytes = axum::body::to_bytes(body, 1 << 20)
        .await
        .unwrap_or_default();
    calls.lock().unwrap().push(BrokerCall {
        method: parts.method.to_string(),
        path: parts.uri.path().to_string(),
        auth: parts
            .headers
            .get(http::header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .map(String::from),
        body: serde_json::from_slice(&bytes).unwrap_or_default(),
    });
    let record = json!({"name": "orders", "partitions": 3, "retention_ms": 43200000u64,
        "visibility_timeout_ms": 30000, "max_in_flight_per_partition": 1024,
        "max_acked_ahead_per_partition": 1024, "created_at": 1, "role": "standalone"});
    let (status, body) = match (parts.method.as_str(), parts.uri.path()) {
        ("GET", "/v1/topics/orders") | ("POST", "/v1/topics/orders/children") => (200, record),
        ("GET", "/v1/topics/orders/children") => (200, json!({"parent": "orders", "children": []})),
        _ => (404, json!({"error": "not found"})),
    };
    (
        http::StatusCode::from_u16(status).unwrap(),
        axum::Json(body),
    )
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

/// Building blocks of scenarios: answer one request each.
impl ApiServerVerifier {
    /// Answers `GET path` (a whole object) with `body`.
    pub async fn get(&mut self, path: &str, body: serde_json::Value) {
        let (req, send) = self.expect("GET", path).await;
        let accept = req.headers().get(http::header::ACCEPT);
        assert!(
            accept.is_none_or(|a| !a.to_str().unwrap().contains("PartialObjectMetadata")),
            "GET {path} asked for metadata only"
        );
        send.send_response(respond(200, body));
    }

    /// Answers the metadata-only `GET` of a Secret (asserting it asks for metadata only:
    /// the data must not be fetched before the label and owners are checked).
    pub async fn secret_metadata(&mut self, meta: serde_json::Value) {
        let name = meta["name"].as_str().unwrap().to_string();
        let (req, send) = self
            .expect("GET", &format!("/api/v1/namespaces/default/secrets/{name}"))
            .await;
        let accept = req.headers()[http::header::ACCEPT].to_str().unwrap();
        assert!(accept.contains("PartialObjectMetadata"), "{accept}");
        send.send_response(respond(
            200,
            json!({"apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadata", "metadata": meta}),
        ));
    }

    /// Answers the metadata-only `GET` of Secret `name` with `404`.
    pub async fn secret_absent(&mut self, name: &str) {
        let (_, send) = self
            .expect("GET", &format!("/api/v1/namespaces/default/secrets/{name}"))
            .await;
        send.send_response(respond(404, not_found(&format!("secrets \"{name}\""))));
    }

    /// Answers the whole `GET` of a Secret with `data` (stringData-like pairs).
    pub async fn secret(&mut self, meta: serde_json::Value, data: &[(&str, &str)]) {
        use base64::Engine;
        let name = meta["name"].as_str().unwrap().to_string();
        let data: serde_json::Map<String, serde_json::Value> = data
            .iter()
            .map(|(k, v)| {
                let b = base64::engine::general_purpose::STANDARD.encode(v);
                (k.to_string(), json!(b))
            })
            .collect();
        self.get(
            &format!("/api/v1/namespaces/default/secrets/{name}"),
            json!({"apiVersion": "v1", "kind": "Secret", "metadata": meta, "data": data}),
        )
        .await;
    }

    /// Answers the list of NaradClusters in `default` with `items`.
    pub async fn list_clusters(&mut self, items: Vec<serde_json::Value>) {
        let (_, send) = self
            .expect(
                "GET",
                "/apis/narad.io/v1alpha1/namespaces/default/naradclusters",
            )
            .await;
        send.send_response(respond(
            200,
            json!({"apiVersion": "narad.io/v1alpha1", "kind": "NaradClusterList",
                   "metadata": {"resourceVersion": "1"}, "items": items}),
        ));
    }

    /// Expects the status patch of `obj` (whose URL path is `path`); returns the patched
    /// `status`.
    pub async fn status_patch(&mut self, path: &str, obj: serde_json::Value) -> serde_json::Value {
        let (req, send) = self.expect("PATCH", &format!("{path}/status")).await;
        let patch = Self::body(req).await;
        send.send_response(respond(200, obj));
        patch["status"].clone()
    }
}

/// The condition `type_` of a status: (status, reason, message).
pub fn condition(status: &serde_json::Value, type_: &str) -> (String, String, String) {
    let c = status["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == type_)
        .unwrap_or_else(|| panic!("no {type_} in {status}"));
    let s = |k: &str| c[k].as_str().unwrap_or_default().to_string();
    (s("status"), s("reason"), s("message"))
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

/// Finding 10 of issue 12: the operator sends credentials only where it may, and reads only
/// Secrets marked for Narad.
#[cfg(test)]
mod credentials {
    use super::*;
    use crate::reconcile::{cluster as cluster_rc, topic as topic_rc, user as user_rc, Error};
    use kube::runtime::controller::Action;

    pub(super) const NC: &str = "/apis/narad.io/v1alpha1/namespaces/default/naradclusters/prod";
    pub(super) const TOPIC: &str = "/apis/narad.io/v1alpha1/namespaces/default/topics/orders";
    const USER: &str = "/apis/narad.io/v1alpha1/namespaces/default/users/billing";

    /// Runs `reconcile` of `obj` with the context of `ctx` against `scenario`, which gets the
    /// verifier and `obj` as JSON (the answer to its status patch); both must finish.
    pub(super) async fn run<K, R, F>(
        obj: K,
        (ctx, verifier): (Arc<Context>, ApiServerVerifier),
        reconcile: impl FnOnce(Arc<K>, Arc<Context>) -> R,
        scenario: impl FnOnce(ApiServerVerifier, serde_json::Value) -> F,
    ) -> Result<Action, Error>
    where
        K: serde::Serialize,
        R: std::future::Future<Output = Result<Action, Error>>,
        F: std::future::Future<Output = ()> + Send + 'static,
    {
        let server = tokio::spawn(scenario(verifier, serde_json::to_value(&obj).unwrap()));
        let r = reconcile(Arc::new(obj), ctx).await;
        tokio::time::timeout(Duration::from_secs(5), server)
            .await
            .expect("scenario finished")
            .expect("scenario passed");
        r
    }

    /// Cluster `prod` with security disabled.
    fn insecure_cluster() -> NaradCluster {
        cluster(json!({"version": "1", "security": {"enabled": false}}))
    }

    /// A test context whose operator reaches the brokers at `url` (its trusted
    /// `broker_endpoint` override).
    pub(super) fn reaching(url: String) -> (Arc<Context>, ApiServerVerifier) {
        test_context_with(|c| c.broker_endpoint = Some(url))
    }

    /// A port where nothing may arrive, and cluster `prod` with it as its endpoint (foreign:
    /// not the cluster's own Service, and no opt-in).
    fn foreign_endpoint() -> (Untouched, NaradCluster) {
        let broker = Untouched::bind();
        let nc = cluster(json!({"version": "1", "endpoint": broker.url()}));
        (broker, nc)
    }

    /// A [`FakeBroker`] the operator reaches, the JSON of cluster `prod` (security disabled),
    /// the finalized Topic `orders` with the remote child `link`, and the test context.
    async fn remote_child(
        link: serde_json::Value,
    ) -> (
        FakeBroker,
        serde_json::Value,
        Topic,
        (Arc<Context>, ApiServerVerifier),
    ) {
        let broker = FakeBroker::start().await;
        let nc_body = serde_json::to_value(insecure_cluster()).unwrap();
        let t = finalized_topic(Some(link));
        let ctx = reaching(broker.url.clone());
        (broker, nc_body, t, ctx)
    }

    pub(super) fn finalized_topic(remote: Option<serde_json::Value>) -> Topic {
        let mut t = topic();
        t.metadata.finalizers = Some(vec!["narad.io/finalizer".into()]);
        if let Some(r) = remote {
            t.spec.remote_children = serde_json::from_value(json!([r])).unwrap();
        }
        t
    }

    fn dr_link() -> serde_json::Value {
        json!({"name": "orders-dr", "url": "https://narad-dr.example.com", "topic": "orders",
               "credentialsSecretRef": {"name": "dr-creds"}})
    }

    /// Asserts that condition `type_` of `status` is `False` for `reason`; returns its message.
    #[track_caller]
    pub(super) fn assert_false(status: &serde_json::Value, type_: &str, reason: &str) -> String {
        let (s, r, msg) = condition(status, type_);
        assert_eq!((s.as_str(), r.as_str()), ("False", reason));
        msg
    }

    pub(super) fn failed_with(r: &Result<Action, Error>, what: &str) {
        match r {
            Err(Error::Finalizer(e)) => {
                let msg = format!("{e} {:?}", e);
                assert!(msg.contains(what), "{msg}");
            }
            other => panic!("expected a refusal ({what}), got {other:?}"),
        }
    }

    #[tokio::test]
    async fn cluster_with_a_foreign_endpoint_is_not_contacted() {
        let (broker, nc) = foreign_endpoint();
        let ctx = test_context();
        let r = run(nc, ctx, cluster_rc::reconcile, |mut v, body| async move {
            // Nothing is read (no security Secret) or applied: only the status.
            let st = v.status_patch(NC, body).await;
            let msg = assert_false(&st, "Ready", "EndpointNotAllowed");
            assert!(msg.contains("allowExternalEndpoint"), "{msg}");
        })
        .await;
        failed_with(&r, "allowExternalEndpoint");
        broker.assert_untouched();
    }

    /// The opt-in of a NaradCluster counts only when the operator is installed with
    /// external endpoints allowed: without the switch the cluster, and its Topics, are
    /// refused with a condition that names it, and nothing is contacted.
    #[tokio::test]
    async fn the_opt_in_without_the_install_wide_switch_is_refused() {
        let broker = Untouched::bind();
        let nc = cluster(
            json!({"version": "1", "endpoint": broker.url(), "allowExternalEndpoint": true}),
        );
        let nc_body = serde_json::to_value(&nc).unwrap();
        let off = || test_context_with(|c| c.allow_external_endpoints = false);
        let r = run(nc, off(), cluster_rc::reconcile, |mut v, body| async move {
            let st = v.status_patch(NC, body).await;
            let msg = assert_false(&st, "Ready", "EndpointNotAllowed");
            assert!(msg.contains("operator.allowExternalEndpoints"), "{msg}");
        })
        .await;
        failed_with(&r, "allowExternalEndpoints");
        let r = run(
            finalized_topic(None),
            off(),
            topic_rc::reconcile,
            |mut v, t_body| async move {
                v.get(NC, nc_body).await;
                let st = v.status_patch(TOPIC, t_body).await;
                for c in ["Ready", "Synced"] {
                    let msg = assert_false(&st, c, "EndpointNotAllowed");
                    assert!(msg.contains("operator.allowExternalEndpoints"), "{msg}");
                }
            },
        )
        .await;
        failed_with(&r, "allowExternalEndpoints");
        broker.assert_untouched();
    }

    #[tokio::test]
    async fn topic_of_a_cluster_with_a_foreign_endpoint_sends_nothing() {
        let (broker, nc) = foreign_endpoint();
        let nc_body = serde_json::to_value(&nc).unwrap();
        let t = finalized_topic(None);
        let ctx = test_context();
        let r = run(t, ctx, topic_rc::reconcile, |mut v, t_body| async move {
            v.get(NC, nc_body).await;
            // No GET of the security Secret: straight to the status.
            let st = v.status_patch(TOPIC, t_body).await;
            for c in ["Ready", "Synced"] {
                assert_false(&st, c, "EndpointNotAllowed");
            }
        })
        .await;
        failed_with(&r, "allowExternalEndpoint");
        broker.assert_untouched();
    }

    #[tokio::test]
    async fn a_foreign_endpoint_with_the_opt_in_gets_the_admin_credentials() {
        let broker = FakeBroker::start().await;
        let nc =
            cluster(json!({"version": "1", "endpoint": broker.url, "allowExternalEndpoint": true}));
        let nc_body = serde_json::to_value(&nc).unwrap();
        let t = finalized_topic(None);
        let ctx = test_context();
        let r = run(t, ctx, topic_rc::reconcile, |mut v, t_body| async move {
            v.get(NC, nc_body).await;
            let own = secret_meta("prod-narad-security", true, Some("nc-1"));
            v.secret_metadata(own.clone()).await;
            v.secret(
                own,
                &[("admin-password", "root-pw"), ("cluster-secret", "c")],
            )
            .await;
            let st = v.status_patch(TOPIC, t_body).await;
            assert_eq!(condition(&st, "Ready").0, "True", "{st}");
        })
        .await;
        assert!(r.is_ok(), "{r:?}");
        let calls = broker.calls();
        assert!(!calls.is_empty());
        use base64::Engine;
        let basic = format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD.encode("admin:root-pw")
        );
        for c in &calls {
            assert_eq!(c.auth.as_deref(), Some(basic.as_str()), "{c:?}");
        }
    }

    #[tokio::test]
    async fn remote_child_with_an_unlabelled_secret_is_refused() {
        let (broker, nc_body, t, ctx) = remote_child(dr_link()).await;
        let r = run(t, ctx, topic_rc::reconcile, |mut v, t_body| async move {
            v.get(NC, nc_body).await;
            // The label is read from the metadata; the data is never fetched.
            v.secret_metadata(secret_meta("dr-creds", false, None))
                .await;
            let st = v.status_patch(TOPIC, t_body).await;
            let msg = assert_false(&st, "Synced", "SecretNotLabelled");
            assert!(msg.contains("narad.io/credentials"), "{msg}");
            assert!(st["remoteLinks"].is_null(), "{st}");
        })
        .await;
        failed_with(&r, "narad.io/credentials");
        let calls = broker.calls();
        assert!(
            calls.iter().all(|c| c.method == "GET"),
            "nothing attached: {calls:?}"
        );
    }

    #[tokio::test]
    async fn remote_child_with_a_labelled_secret_is_attached() {
        let (broker, nc_body, t, ctx) = remote_child(dr_link()).await;
        let r = run(t, ctx, topic_rc::reconcile, |mut v, t_body| async move {
            v.get(NC, nc_body.clone()).await;
            let m = secret_meta("dr-creds", true, None);
            v.secret_metadata(m.clone()).await;
            v.list_clusters(vec![nc_body]).await;
            v.secret(m, &[("username", "replicator"), ("password", "dr-pw")])
                .await;
            let st = v.status_patch(TOPIC, t_body).await;
            assert_eq!(condition(&st, "Ready").0, "True", "{st}");
            assert_eq!(st["remoteLinks"], json!(["orders-dr"]));
        })
        .await;
        assert!(r.is_ok(), "{r:?}");
        let attach = broker
            .calls()
            .into_iter()
            .find(|c| c.method == "POST")
            .expect("attach");
        assert_eq!(attach.path, "/v1/topics/orders/children");
        assert_eq!(attach.body["remote"]["username"], "replicator");
        assert_eq!(attach.body["remote"]["password"], "dr-pw");
    }

    #[tokio::test]
    async fn remote_child_never_gets_a_cluster_security_secret() {
        let mut link = dr_link();
        link["credentialsSecretRef"] = json!({"name": "prod-narad-security", "usernameKey": "cluster-secret",
                   "passwordKey": "admin-password"});
        let (broker, nc_body, t, ctx) = remote_child(link).await;
        let r = run(t, ctx, topic_rc::reconcile, |mut v, t_body| async move {
            v.get(NC, nc_body.clone()).await;
            // Labelled by whoever made it, no owner: still prod's security Secret.
            v.secret_metadata(secret_meta("prod-narad-security", true, None))
                .await;
            v.list_clusters(vec![nc_body]).await;
            let st = v.status_patch(TOPIC, t_body).await;
            assert_false(&st, "Synced", "SecretNotAllowed");
        })
        .await;
        failed_with(&r, "security or TLS Secret");
        assert!(broker.calls().iter().all(|c| c.method == "GET"));
    }

    #[tokio::test]
    async fn user_with_an_unlabelled_password_secret_is_refused() {
        let broker = Untouched::bind();
        let nc_body = serde_json::to_value(insecure_cluster()).unwrap();
        let ctx = reaching(broker.url());
        let u = user();
        let r = run(u, ctx, user_rc::reconcile, |mut v, u_body| async move {
            v.get(NC, nc_body).await;
            v.secret_metadata(secret_meta("billing-password", false, None))
                .await;
            let st = v.status_patch(USER, u_body).await;
            assert_false(&st, "Ready", "SecretNotLabelled");
        })
        .await;
        failed_with(&r, "narad.io/credentials");
        broker.assert_untouched();
    }

    #[tokio::test]
    async fn cluster_refuses_an_unlabelled_security_secret() {
        let nc = cluster(json!({"version": "1", "security": {"secretRef": {"name": "mine"}}}));
        let ctx = test_context();
        let r = run(nc, ctx, cluster_rc::reconcile, |mut v, body| async move {
            v.secret_metadata(secret_meta("mine", false, None)).await;
            // Neither patched nor mounted: nothing is applied.
            let st = v.status_patch(NC, body).await;
            assert_false(&st, "Ready", "SecretNotLabelled");
        })
        .await;
        failed_with(&r, "narad.io/credentials");
    }

    #[tokio::test]
    async fn cluster_refuses_another_clusters_security_secret() {
        let nc = cluster(json!({"version": "1",
            "security": {"secretRef": {"name": "other-narad-security"}}}));
        let ctx = test_context();
        let r = run(nc, ctx, cluster_rc::reconcile, |mut v, body| async move {
            v.secret_metadata(secret_meta("other-narad-security", true, Some("nc-2")))
                .await;
            let st = v.status_patch(NC, body).await;
            assert_eq!(condition(&st, "Ready").1, "SecretNotAllowed");
        })
        .await;
        failed_with(&r, "another NaradCluster");
    }
}

/// Findings 2 and 3 of issue 12 in the operator: a cluster whose API serves TLS
/// (`spec.security.apiTLSSecretRef`) is called at `https://`, trusting its API-TLS Secret's
/// `ca.crt`; a Secret that is missing or unusable, a CA that does not sign the brokers'
/// certificate and a plain `http://` endpoint are conditions, never a plaintext fallback.
#[cfg(test)]
mod api_tls {
    use super::credentials::{
        assert_false, failed_with, finalized_topic, reaching, run, NC, TOPIC,
    };
    use super::*;
    use crate::reconcile::{cluster as cluster_rc, topic as topic_rc};
    use narad_tests::certs::TestCa;

    const API_TLS: &str = "prod-api-tls";

    /// A CA, and an HTTPS fake broker whose certificate it signed (for `127.0.0.1`).
    async fn https_broker() -> (TestCa, FakeBroker, tempfile::TempDir) {
        let dir = tempfile::tempdir().unwrap();
        let ca = TestCa::new("narad-api-ca");
        let files = ca.issue(dir.path(), "api", &["127.0.0.1"]);
        let broker = FakeBroker::start_tls(&files).await;
        (ca, broker, dir)
    }

    /// Cluster `prod` with API TLS from Secret [`API_TLS`] and `extra` merged into its spec.
    fn tls_cluster(extra: serde_json::Value) -> NaradCluster {
        let mut spec = json!({"version": "1", "security": {"apiTLSSecretRef": {"name": API_TLS}}});
        spec.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        cluster(spec)
    }

    /// The labelled API-TLS Secret with `ca` as its `ca.crt`.
    async fn tls_secret(v: &mut ApiServerVerifier, ca: &str) {
        let m = secret_meta(API_TLS, true, None);
        v.secret_metadata(m.clone()).await;
        v.secret(
            m,
            &[("tls.crt", "unused"), ("tls.key", "unused"), ("ca.crt", ca)],
        )
        .await;
    }

    #[tokio::test]
    async fn topic_reaches_an_https_broker_trusting_the_secrets_ca() {
        let (ca, broker, _dir) = https_broker().await;
        assert!(broker.url.starts_with("https://"));
        let nc = tls_cluster(json!({"endpoint": broker.url, "allowExternalEndpoint": true}));
        let nc_body = serde_json::to_value(&nc).unwrap();
        let ca_pem = ca.pem();
        let r = run(
            finalized_topic(None),
            test_context(),
            topic_rc::reconcile,
            |mut v, t_body| async move {
                v.get(NC, nc_body).await;
                // The TLS Secret first: no credentials are read for a broker that cannot
                // be reached safely.
                tls_secret(&mut v, &ca_pem).await;
                let own = secret_meta("prod-narad-security", true, Some("nc-1"));
                v.secret_metadata(own.clone()).await;
                v.secret(own, &[("admin-password", "root-pw")]).await;
                let st = v.status_patch(TOPIC, t_body).await;
                assert_eq!(condition(&st, "Ready").0, "True", "{st}");
            },
        )
        .await;
        assert!(r.is_ok(), "{r:?}");
        let calls = broker.calls();
        assert!(
            calls.iter().any(|c| c.path == "/v1/topics/orders"),
            "{calls:?}"
        );
        assert!(
            calls.iter().all(|c| c.auth.is_some()),
            "admin credentials, over TLS"
        );
        assert_eq!(broker.handshake_failures(), 0);
    }

    #[tokio::test]
    async fn a_ca_that_did_not_sign_the_brokers_certificate_is_a_condition() {
        let (_ca, broker, _dir) = https_broker().await;
        let other = TestCa::new("someone-else").pem();
        let nc = tls_cluster(
            json!({"endpoint": broker.url, "allowExternalEndpoint": true,
            "security": {"enabled": false, "apiTLSSecretRef": {"name": API_TLS}}}),
        );
        let nc_body = serde_json::to_value(&nc).unwrap();
        let r = run(
            finalized_topic(None),
            test_context(),
            topic_rc::reconcile,
            |mut v, t_body| async move {
                v.get(NC, nc_body).await;
                tls_secret(&mut v, &other).await;
                let st = v.status_patch(TOPIC, t_body).await;
                let msg = assert_false(&st, "Synced", "BrokerUnreachable");
                assert!(
                    msg.to_ascii_lowercase().contains("certificate"),
                    "the reason is named: {msg}"
                );
            },
        )
        .await;
        assert!(r.is_err(), "{r:?}");
        assert!(broker.calls().is_empty(), "no request got through");
        // The server counts the refused handshake on its own task.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        while broker.handshake_failures() == 0 && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(broker.handshake_failures() > 0);
    }

    #[tokio::test]
    async fn a_plain_http_endpoint_is_refused_with_api_tls() {
        let broker = Untouched::bind();
        let nc = tls_cluster(json!({"endpoint": broker.url(), "allowExternalEndpoint": true}));
        let nc_body = serde_json::to_value(&nc).unwrap();
        let r = run(
            finalized_topic(None),
            test_context(),
            topic_rc::reconcile,
            |mut v, t_body| async move {
                v.get(NC, nc_body).await;
                let st = v.status_patch(TOPIC, t_body).await;
                let msg = assert_false(&st, "Synced", "EndpointNotAllowed");
                assert!(msg.contains("https"), "{msg}");
            },
        )
        .await;
        failed_with(&r, "https");
        // The cluster itself is refused too, before anything is read or applied.
        let r = run(
            nc,
            test_context(),
            cluster_rc::reconcile,
            |mut v, body| async move {
                let st = v.status_patch(NC, body).await;
                assert_false(&st, "Ready", "EndpointNotAllowed");
            },
        )
        .await;
        failed_with(&r, "apiTLSSecretRef");
        broker.assert_untouched();
    }

    #[tokio::test]
    async fn the_operators_plain_http_override_is_refused_with_api_tls() {
        let broker = Untouched::bind();
        let nc_body = serde_json::to_value(tls_cluster(json!({}))).unwrap();
        let r = run(
            finalized_topic(None),
            reaching(broker.url()),
            topic_rc::reconcile,
            |mut v, t_body| async move {
                v.get(NC, nc_body).await;
                let st = v.status_patch(TOPIC, t_body).await;
                let msg = assert_false(&st, "Synced", "EndpointNotAllowed");
                assert!(msg.contains("not https://"), "{msg}");
            },
        )
        .await;
        failed_with(&r, "https");
        broker.assert_untouched();
    }

    #[tokio::test]
    async fn topic_of_a_cluster_whose_tls_secret_is_unlabelled_sends_nothing() {
        let broker = Untouched::bind();
        let https = broker.url().replace("http://", "https://");
        let nc = tls_cluster(json!({"endpoint": https, "allowExternalEndpoint": true}));
        let nc_body = serde_json::to_value(&nc).unwrap();
        let r = run(
            finalized_topic(None),
            test_context(),
            topic_rc::reconcile,
            |mut v, t_body| async move {
                v.get(NC, nc_body).await;
                v.secret_metadata(secret_meta(API_TLS, false, None)).await;
                let st = v.status_patch(TOPIC, t_body).await;
                assert_false(&st, "Synced", "SecretNotLabelled");
            },
        )
        .await;
        failed_with(&r, "narad.io/credentials");
        broker.assert_untouched();
    }

    #[tokio::test]
    async fn cluster_with_a_missing_api_tls_secret_applies_nothing() {
        let nc = tls_cluster(json!({}));
        let r = run(
            nc,
            test_context(),
            cluster_rc::reconcile,
            |mut v, body| async move {
                v.secret_absent(API_TLS).await;
                // No security Secret, no StatefulSet: only the status.
                let st = v.status_patch(NC, body).await;
                let msg = assert_false(&st, "Ready", "SecretNotFound");
                assert!(msg.contains(API_TLS), "{msg}");
            },
        )
        .await;
        failed_with(&r, "does not exist");
    }

    #[tokio::test]
    async fn cluster_with_an_unusable_ca_applies_nothing() {
        let nc = tls_cluster(json!({}));
        let r = run(
            nc,
            test_context(),
            cluster_rc::reconcile,
            |mut v, body| async move {
                tls_secret(&mut v, "not a certificate").await;
                let st = v.status_patch(NC, body).await;
                let msg = assert_false(&st, "Ready", "TLSSecretInvalid");
                assert!(msg.contains("ca.crt"), "{msg}");
            },
        )
        .await;
        failed_with(&r, "ca.crt");
    }
}

/// `managementPolicy: Observe`: the broker topic is read, never created, changed or
/// deleted.
#[cfg(test)]
mod observe {
    use super::credentials::{assert_false, finalized_topic, reaching, run, NC, TOPIC};
    use super::*;
    use crate::crd::ManagementPolicy;
    use crate::reconcile::topic as topic_rc;

    fn observed(spec_name: Option<&str>) -> Topic {
        let mut t = finalized_topic(None);
        t.spec.management_policy = ManagementPolicy::Observe;
        t.spec.retention = Some("2h".into());
        t.spec.name = spec_name.map(String::from);
        t
    }

    fn insecure() -> serde_json::Value {
        serde_json::to_value(cluster(
            json!({"version": "1", "security": {"enabled": false}}),
        ))
        .unwrap()
    }

    #[tokio::test]
    async fn an_existing_topic_is_reported_and_the_difference_is_not_applied() {
        let broker = FakeBroker::start().await;
        let r = run(
            observed(None),
            reaching(broker.url.clone()),
            topic_rc::reconcile,
            |mut v, t_body| async move {
                v.get(NC, insecure()).await;
                let st = v.status_patch(TOPIC, t_body).await;
                for c in ["Ready", "Synced"] {
                    let (s, reason, msg) = condition(&st, c);
                    assert_eq!((s.as_str(), reason.as_str()), ("True", "Observed"), "{st}");
                    assert!(
                        msg.contains("retention: spec 7200000 ms, broker 43200000 ms"),
                        "{msg}"
                    );
                }
                assert_eq!(st["partitions"], 3);
                assert_eq!(st["role"], "standalone");
                assert!(
                    st.get("replica").is_none(),
                    "nothing applied is recorded: {st}"
                );
            },
        )
        .await;
        assert!(r.is_ok(), "{r:?}");
        let calls = broker.calls();
        assert!(!calls.is_empty());
        assert!(
            calls.iter().all(|c| c.method == "GET"),
            "only reads: {calls:?}"
        );
    }

    #[tokio::test]
    async fn a_missing_topic_is_not_found_and_not_created() {
        let broker = FakeBroker::start().await;
        let r = run(
            observed(Some("ghost")),
            reaching(broker.url.clone()),
            topic_rc::reconcile,
            |mut v, t_body| async move {
                v.get(NC, insecure()).await;
                let st = v.status_patch(TOPIC, t_body).await;
                for c in ["Ready", "Synced"] {
                    let msg = assert_false(&st, c, "NotFound");
                    assert!(
                        msg.contains("\"ghost\"") && msg.contains("never creates"),
                        "{msg}"
                    );
                }
            },
        )
        .await;
        // Not an error: looked up again after the resync period.
        let action = r.expect("a requeue");
        assert_eq!(
            action,
            kube::runtime::controller::Action::requeue(Duration::from_secs(300))
        );
        let calls = broker.calls();
        assert_eq!(calls.len(), 1, "{calls:?}");
        assert_eq!(
            (calls[0].method.as_str(), calls[0].path.as_str()),
            ("GET", "/v1/topics/ghost")
        );
    }

    #[tokio::test]
    async fn deleting_the_resource_leaves_the_broker_topic() {
        let broker = Untouched::bind();
        let mut t = observed(None);
        t.metadata.deletion_timestamp = Some(crate::reconcile::now());
        let r = run(
            t,
            reaching(broker.url()),
            topic_rc::reconcile,
            |mut v, t_body| async move {
                // Neither the cluster nor the broker: the finalizer goes at once.
                let (req, send) = v.expect("PATCH", TOPIC).await;
                let patch = ApiServerVerifier::body(req).await;
                assert_eq!(
                    patch[1],
                    json!({"op": "remove", "path": "/metadata/finalizers/0"})
                );
                send.send_response(respond(200, t_body));
            },
        )
        .await;
        assert!(r.is_ok(), "{r:?}");
        broker.assert_untouched();
    }
}
