//! The OpenAPI 3.1 document of the HTTP API, served at `GET /v1/openapi.json` (no credentials)
//! and kept in the repository as `api/openapi.json`.
//!
//! It is not written by hand: [`routes`] registers every handler through `utoipa-axum`, so a
//! route exists in the router exactly when its operation is in the document. Each handler's
//! `#[utoipa::path]` declares its parameters, body and the statuses particular to it; the
//! statuses every `/v1` route can answer (authentication, throttling, codings, faults) are
//! added here once ([`CommonAnswers`]), as references to the shared responses of
//! `components`. The black-box suite validates real answers against this document
//! (`narad_tests::openapi`).

use std::sync::OnceLock;

use axum::http::StatusCode;
use axum::response::Response;
use utoipa::openapi::path::{HttpMethod, Operation};
use utoipa::openapi::response::ResponseBuilder;
use utoipa::openapi::security::{Http, HttpAuthScheme, SecurityRequirement, SecurityScheme};
use utoipa::openapi::{ContentBuilder, HeaderBuilder, Ref, RefOr};
use utoipa::{IntoParams, Modify, OpenApi};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::{children, consume, produce, queue, system, topics, users, ApiState};

/// The path of the document itself.
pub const PATH: &str = "/v1/openapi.json";

/// A consume's answer: one message, or with `max` a batch of them.
#[derive(utoipa::ToSchema)]
#[allow(dead_code)]
#[serde(untagged)]
pub enum ConsumeAnswer {
    One(narad_api::Message),
    Many(narad_api::MessageBatch),
}

/// The `{topic}` segment.
#[derive(IntoParams)]
#[into_params(parameter_in = Path)]
#[allow(dead_code)]
pub struct TopicPath {
    /// The topic's name (1-249 of `[A-Za-z0-9._-]`, percent-encoded).
    topic: String,
}

/// The `{user}` segment.
#[derive(IntoParams)]
#[into_params(parameter_in = Path)]
#[allow(dead_code)]
pub struct UserPath {
    /// The username (`^[A-Za-z0-9._-]{1,64}$`).
    user: String,
}

#[derive(OpenApi)]
#[openapi(
    info(
        title = "Narad",
        description = "A queue-first message broker over plain HTTP. Producers POST raw bytes \
            to a topic on any node (`202` = fsynced on that node); consumers lease one message \
            (or up to 100) at a time and ack, extend or nack it by its receipt handle.\n\n\
            Every error body is `{\"error\":\"<message>\"}`. An unknown route answers `404` and \
            a method a route does not take `405` with `Allow`, both with that body. `503` and \
            `429` carry `Retry-After` (seconds). With security on, every `/v1` route but this \
            document needs HTTP Basic credentials; probes and metrics never do. Operations \
            marked (ext) go beyond the Go implementation's API.",
        license(name = "Apache-2.0", identifier = "Apache-2.0"),
    ),
    tags(
        (name = "topics", description = "Create, list, read, alter and delete topics."),
        (name = "messages", description = "Produce, consume (lease or replay), ack, extend, nack."),
        (name = "queue", description = "(ext) Pause, resume, purge, seek and redrive a topic's queue."),
        (name = "children", description = "Child topics: fan-out, delay, replica and remote links."),
        (name = "users", description = "Users, grants, passwords and quotas (security on)."),
        (name = "cluster", description = "Members, partition moves, decommission."),
        (name = "system", description = "Probes, metrics and this document."),
    ),
    components(responses(
        Unauthorized, Forbidden, TopicNotFound, BodyTimeout, UnsupportedCoding, Throttled,
        Internal, CodingNotImplemented, MaybeApplied, Unavailable, BadRequest, TooLarge
    )),
    modifiers(&CommonAnswers),
)]
struct ApiDoc;

/// Every route of the server's API listener (but `/metrics`, whose handler depends on
/// `http.metrics_addr`), with its part of the document.
pub fn routes() -> OpenApiRouter<ApiState> {
    OpenApiRouter::with_openapi(ApiDoc::openapi())
        .routes(routes!(topics::create, topics::list))
        .routes(routes!(topics::get, topics::alter, topics::delete))
        .routes(routes!(produce::produce))
        .routes(routes!(produce::produce_batch))
        .routes(routes!(consume::consume))
        .routes(routes!(consume::ack))
        .routes(routes!(queue::pause))
        .routes(routes!(queue::resume))
        .routes(routes!(queue::purge))
        .routes(routes!(queue::seek))
        .routes(routes!(queue::redrive))
        .routes(routes!(children::attach, children::list))
        .routes(routes!(children::detach))
        .routes(routes!(users::create, users::list))
        .routes(routes!(users::get, users::delete))
        .routes(routes!(users::put_grants))
        .routes(routes!(users::put_quotas))
        .routes(routes!(users::put_password))
        .routes(routes!(system::members))
        .routes(routes!(system::moves))
        .routes(routes!(system::decommission, system::cancel_decommission))
        .routes(routes!(system::healthz))
        .routes(routes!(system::readyz))
        .routes(routes!(document))
}

/// The whole document, built once: [`routes`]' operations plus `/metrics`.
pub fn model() -> &'static utoipa::openapi::OpenApi {
    static DOC: OnceLock<utoipa::openapi::OpenApi> = OnceLock::new();
    DOC.get_or_init(|| {
        let mut doc = routes().split_for_parts().1;
        doc.merge(MetricsDoc::openapi());
        CommonAnswers.modify(&mut doc);
        doc
    })
}

#[derive(OpenApi)]
#[openapi(paths(system::metrics))]
struct MetricsDoc;

/// The document as served (pretty JSON with a final newline, as the repository keeps it).
pub fn json() -> &'static str {
    static JSON: OnceLock<String> = OnceLock::new();
    JSON.get_or_init(|| {
        let mut s = model()
            .to_pretty_json()
            .expect("the OpenAPI document serializes");
        s.push('\n');
        s
    })
}

/// This document.
#[utoipa::path(
    get,
    path = "/v1/openapi.json",
    tag = "system",
    operation_id = "openapi",
    security(()),
    responses((status = 200, description = "The OpenAPI 3.1 document of this API.", content_type = "application/json")),
)]
pub async fn document() -> Response {
    super::json_response(StatusCode::OK, json().as_bytes().to_vec())
}

fn error_response(description: &str) -> utoipa::openapi::response::Response {
    ResponseBuilder::new()
        .description(description)
        .content(
            "application/json",
            ContentBuilder::new()
                .schema(Some(Ref::from_schema_name("ErrorBody")))
                .build(),
        )
        .build()
}

fn retry_after(mut r: utoipa::openapi::response::Response) -> utoipa::openapi::response::Response {
    r.headers.insert(
        "Retry-After".into(),
        HeaderBuilder::new()
            .schema(Some(<u32 as utoipa::PartialSchema>::schema()))
            .description(Some("Seconds to wait before retrying."))
            .build()
            .into(),
    );
    r
}

macro_rules! shared_response {
    ($name:ident, $description:expr) => {
        shared_response!($name, $description, |r| r);
    };
    ($name:ident, $description:expr, $extra:expr) => {
        pub struct $name;
        impl utoipa::ToResponse<'static> for $name {
            fn response() -> (&'static str, RefOr<utoipa::openapi::response::Response>) {
                #[allow(clippy::redundant_closure_call)]
                let r = ($extra)(error_response($description));
                (stringify!($name), RefOr::T(r))
            }
        }
    };
}

shared_response!(
    BadRequest,
    "Malformed request: a bad parameter, path segment or body."
);
shared_response!(
    Unauthorized,
    "Security is on and the credentials are missing or wrong.",
    |mut r: utoipa::openapi::response::Response| {
        r.headers.insert(
            "WWW-Authenticate".into(),
            HeaderBuilder::new()
                .schema(Some(<String as utoipa::PartialSchema>::schema()))
                .description(Some("`Basic realm=\"narad\"`"))
                .build()
                .into(),
        );
        r
    }
);
shared_response!(
    Forbidden,
    "Authenticated, but the caller lacks the grant this needs."
);
shared_response!(TopicNotFound, "The topic does not exist.");
shared_response!(
    BodyTimeout,
    "The request body did not arrive in time (`http.body_read_timeout`)."
);
shared_response!(
    TooLarge,
    "The body is over its limit (1 MiB for a message and for JSON bodies)."
);
shared_response!(
    UnsupportedCoding,
    "The body comes in a Content-Encoding this route does not decode (produce takes gzip and \
     zstd, other routes identity only); `Accept-Encoding` names what it takes."
);
shared_response!(
    Throttled,
    "Too many failed logins from this client, or a quota is exhausted: wait `Retry-After`.",
    retry_after
);
shared_response!(
    Internal,
    "A fault of this node (logged): retry with backoff."
);
shared_response!(
    CodingNotImplemented,
    "A Transfer-Encoding other than `chunked`."
);
shared_response!(
    MaybeApplied,
    "The outcome is unknown (an answer lost on the way from the node that acted, a metadata \
     write not confirmed in time): the change may still be applied, a forwarded consume may \
     have leased a message (it comes back when the lease expires)."
);
shared_response!(
    Unavailable,
    "Nothing was done and a retry may succeed: no metadata leader or quorum, the partition's \
     owner is down, the node is draining, a limit is full. Retry after `Retry-After`.",
    retry_after
);

/// Adds what every `/v1` operation shares: HTTP Basic security, and the answers any of them
/// can give (as references to `components.responses`) where the operation does not declare
/// them itself; `502` too, since any request may be forwarded to another node and its answer
/// lost (a forwarded consume may have leased). Writes (POST, PUT, PATCH, DELETE) add `408`.
struct CommonAnswers;

impl CommonAnswers {
    fn operations(doc: &mut utoipa::openapi::OpenApi) -> Vec<(HttpMethod, &mut Operation)> {
        let mut out = Vec::new();
        for (path, item) in doc.paths.paths.iter_mut() {
            if !path.starts_with("/v1/") || path == PATH {
                continue;
            }
            let ops = [
                (HttpMethod::Get, &mut item.get),
                (HttpMethod::Post, &mut item.post),
                (HttpMethod::Put, &mut item.put),
                (HttpMethod::Patch, &mut item.patch),
                (HttpMethod::Delete, &mut item.delete),
            ];
            for (m, op) in ops {
                if let Some(op) = op.as_mut() {
                    out.push((m, op));
                }
            }
        }
        out
    }
}

impl Modify for CommonAnswers {
    fn modify(&self, doc: &mut utoipa::openapi::OpenApi) {
        doc.components
            .get_or_insert_with(Default::default)
            .security_schemes
            .insert(
                "basic".into(),
                SecurityScheme::Http(Http::new(HttpAuthScheme::Basic)).into(),
            );
        for (method, op) in Self::operations(doc) {
            op.security = Some(vec![SecurityRequirement::new(
                "basic",
                Vec::<String>::new(),
            )]);
            let write = !matches!(method, HttpMethod::Get);
            let mut common = vec![
                ("400", "BadRequest"),
                ("401", "Unauthorized"),
                ("415", "UnsupportedCoding"),
                ("429", "Throttled"),
                ("500", "Internal"),
                ("501", "CodingNotImplemented"),
                ("502", "MaybeApplied"),
                ("503", "Unavailable"),
            ];
            if write {
                common.push(("408", "BodyTimeout"));
            }
            for (status, name) in common {
                op.responses
                    .responses
                    .entry(status.to_string())
                    .or_insert_with(|| {
                        RefOr::Ref(Ref::new(format!("#/components/responses/{name}")))
                    });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Where the repository keeps the document.
    fn kept() -> std::path::PathBuf {
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../api/openapi.json")
    }

    /// The document in the repository is the one the code generates. To update it:
    /// `NARAD_WRITE_OPENAPI=1 cargo test -p narad --lib openapi`.
    #[test]
    fn the_kept_document_is_the_generated_one() {
        let now = json();
        if std::env::var_os("NARAD_WRITE_OPENAPI").is_some() {
            std::fs::write(kept(), now).unwrap();
        }
        let kept = std::fs::read_to_string(kept()).unwrap_or_default();
        assert!(
            kept == now,
            "api/openapi.json differs from the generated document: run \
             `NARAD_WRITE_OPENAPI=1 cargo test -p narad --lib openapi` and commit it"
        );
    }

    #[test]
    fn every_operation_is_named_tagged_and_answers() {
        let doc: serde_json::Value = serde_json::from_str(json()).unwrap();
        assert_eq!(doc["openapi"], "3.1.0");
        let mut seen = std::collections::BTreeSet::new();
        for (path, item) in doc["paths"].as_object().unwrap() {
            for (method, op) in item.as_object().unwrap() {
                let id = op["operationId"].as_str().unwrap_or_default().to_string();
                assert!(!id.is_empty(), "{method} {path} has no operationId");
                assert!(seen.insert(id.clone()), "operationId {id} is used twice");
                assert!(op["tags"].as_array().is_some_and(|t| !t.is_empty()), "{id}");
                let answers = op["responses"].as_object().unwrap();
                assert!(
                    answers.keys().any(|s| s.starts_with('2')),
                    "{id} declares no success"
                );
                let secured = op["security"] == serde_json::json!([{"basic": []}]);
                let v1 = path.starts_with("/v1/") && path != PATH;
                assert_eq!(
                    v1,
                    secured && answers.contains_key("401"),
                    "{id}: /v1 routes need credentials, nothing else does"
                );
            }
        }
        assert!(seen.len() >= 32, "{} operations", seen.len());
    }
}
