//! The web console (ext): a small single-page app at `/ui`, plain HTML, JavaScript and CSS
//! from `broker/console/`, embedded in the binary. It owns no state and has no API of its
//! own: the page's script calls the `/v1` endpoints of the node that served it (same origin),
//! so whatever it shows or changes goes through the same authorization as any client.
//!
//! - `http.console_enabled` (`NARAD_HTTP_CONSOLE_ENABLED`, default true): off, `/ui` is not
//!   routed (`404` like any unknown route).
//! - Authentication is the API's: with security on, every `/ui` request needs HTTP Basic
//!   credentials (`401` with `WWW-Authenticate: Basic realm="narad"` makes a browser prompt
//!   for them, and it then sends them with the page's `/v1` requests too).
//! - Every answer carries a strict Content-Security-Policy (scripts, styles, images and
//!   requests from this origin only; no inline code, no framing), `nosniff`, and cache
//!   headers: the page is revalidated on every load (`no-cache` with an `ETag`), and the
//!   files it names carry a content hash in their URL and are cached as immutable.

use std::sync::{Arc, OnceLock};

use axum::extract::{Path, Request, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;

use crate::app::App;
use crate::error::ApiError;

/// `Content-Security-Policy` of every console answer.
pub const CSP: &str = "default-src 'self'; script-src 'self'; style-src 'self'; \
     img-src 'self'; connect-src 'self'; base-uri 'none'; form-action 'none'; \
     frame-ancestors 'none'";

/// The page; `{{app.js}}`, `{{app.css}}` and `{{favicon.svg}}` become the files' hashed URLs.
const INDEX: &str = include_str!("../console/index.html");

/// The files the page loads: name, content type, bytes.
const FILES: [(&str, &str, &[u8]); 3] = [
    (
        "app.js",
        "text/javascript; charset=utf-8",
        include_bytes!("../console/app.js"),
    ),
    (
        "app.css",
        "text/css; charset=utf-8",
        include_bytes!("../console/app.css"),
    ),
    (
        "favicon.svg",
        "image/svg+xml",
        include_bytes!("../console/favicon.svg"),
    ),
];

/// One file as served: its bytes, content type and strong `ETag` (from a content hash).
struct Asset {
    body: &'static [u8],
    content_type: &'static str,
    etag: String,
}

struct Assets {
    index: Asset,
    files: Vec<(&'static str, Asset)>,
}

/// A strong `ETag` of `bytes`: CRC32C and length, enough to tell builds apart.
fn etag_of(bytes: &[u8]) -> String {
    format!("\"{:08x}-{:x}\"", crc32c::crc32c(bytes), bytes.len())
}

/// The assets, built once: the page with the hashed URLs of its files filled in.
fn assets() -> &'static Assets {
    static ASSETS: OnceLock<Assets> = OnceLock::new();
    ASSETS.get_or_init(|| {
        let mut index = INDEX.to_string();
        let files = FILES
            .iter()
            .map(|&(name, content_type, body)| {
                let etag = etag_of(body);
                let version = etag.trim_matches('"').to_string();
                index = index.replace(
                    &format!("{{{{{name}}}}}"),
                    &format!("/ui/{name}?v={version}"),
                );
                (
                    name,
                    Asset {
                        body,
                        content_type,
                        etag,
                    },
                )
            })
            .collect();
        let body: &'static [u8] = Box::leak(index.into_boxed_str()).as_bytes();
        Assets {
            index: Asset {
                body,
                content_type: "text/html; charset=utf-8",
                etag: etag_of(body),
            },
            files,
        }
    })
}

/// Adds the console's routes to `routes` when `http.console_enabled`; otherwise `/ui` stays
/// unrouted (`404`).
pub fn mount<S: Clone + Send + Sync + 'static>(routes: Router<S>, app: &Arc<App>) -> Router<S> {
    if !app.config.http.console_enabled {
        return routes;
    }
    let console = Router::new()
        .route("/ui", get(page))
        .route("/ui/", get(page))
        .route("/ui/{file}", get(file))
        .route_layer(axum::middleware::from_fn_with_state(
            app.clone(),
            authenticate,
        ));
    routes.merge(console)
}

/// The API's authentication for the console (SPEC §4.1): with security on, Basic
/// credentials of any user (`401` with `WWW-Authenticate`, `429` when throttled). What a
/// user may see or change is decided by the `/v1` calls the page makes.
async fn authenticate(State(app): State<Arc<App>>, req: Request, next: Next) -> Response {
    match app.caller_of(req.headers()).await {
        Ok(_) => next.run(req).await,
        Err(e) => with_policy(e.into_response()),
    }
}

async fn page(headers: HeaderMap) -> Response {
    serve(&assets().index, &headers, "no-cache")
}

async fn file(
    name: Result<Path<String>, axum::extract::rejection::PathRejection>,
    headers: HeaderMap,
) -> Response {
    let name = name.map(|Path(n)| n).unwrap_or_default();
    match assets().files.iter().find(|(n, _)| *n == name) {
        // The page names each file by its hash (`?v=`), so a name's content never changes.
        Some((_, asset)) => serve(asset, &headers, "private, max-age=31536000, immutable"),
        None => with_policy(ApiError::not_found("route not found").into_response()),
    }
}

/// `200` with the asset, or `304` when the client's `If-None-Match` names its `ETag`.
fn serve(asset: &Asset, req: &HeaderMap, cache: &'static str) -> Response {
    let fresh = req
        .get_all(header::IF_NONE_MATCH)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|t| {
            let t = t.trim();
            t == "*" || t.trim_start_matches("W/") == asset.etag
        });
    let mut resp = if fresh {
        StatusCode::NOT_MODIFIED.into_response()
    } else {
        (StatusCode::OK, asset.body).into_response()
    };
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(asset.content_type),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static(cache));
    if let Ok(v) = HeaderValue::from_str(&asset.etag) {
        h.insert(header::ETAG, v);
    }
    with_policy(resp)
}

/// The security headers of every console answer, errors included.
fn with_policy(mut resp: Response) -> Response {
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CSP),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_page_names_every_file_by_its_hash() {
        let a = assets();
        let page = std::str::from_utf8(a.index.body).unwrap();
        assert!(!page.contains("{{"), "a placeholder is left: {page}");
        for (name, asset) in &a.files {
            let url = format!("/ui/{name}?v={}", asset.etag.trim_matches('"'));
            assert!(page.contains(&url), "{url} missing from the page");
        }
    }

    #[test]
    fn if_none_match_answers_not_modified() {
        let a = &assets().files[0].1;
        let mut h = HeaderMap::new();
        assert_eq!(serve(a, &h, "no-cache").status(), StatusCode::OK);
        h.insert(
            header::IF_NONE_MATCH,
            HeaderValue::from_str(&format!("\"x\", W/{}", a.etag)).unwrap(),
        );
        let r = serve(a, &h, "no-cache");
        assert_eq!(r.status(), StatusCode::NOT_MODIFIED);
        assert_eq!(r.headers()[header::ETAG], a.etag.as_str());
        assert_eq!(r.headers()[header::CONTENT_SECURITY_POLICY], CSP);
    }
}
