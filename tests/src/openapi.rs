//! The OpenAPI document as a contract the whole black-box suite checks: every answer a test
//! gets through [`crate::Http`] is checked against `api/openapi.json` (the repository's copy,
//! which the broker's unit test keeps equal to what it generates and serves).
//!
//! For a request whose path matches an operation's template:
//! - a method the path does not list must be answered `405` (under `/v1`, `401` or `429`
//!   before routing);
//! - the status must be one the operation declares (directly or through
//!   `#/components/responses`);
//! - a JSON answer (`application/json` with a body) must validate against the schema declared
//!   for that status (JSON Schema 2020-12, the dialect of OpenAPI 3.1), and a status declared
//!   with a JSON body must come with `Content-Type: application/json`.
//!
//! A path under `/v1` no operation matches must be answered `404` (or `405`, or `401` or
//! `429` before routing); paths outside `/v1` the document does not list (the console's
//! `/ui`) are not checked. `HEAD` is not checked
//! (the document lists no HEAD operation; the router answers HEAD of GET routes as GET).
//! Violations panic in the test that met them. [`seen`] lists the (operation, status) pairs
//! met so far in this process, for coverage checks.

use std::collections::{BTreeSet, HashMap};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};

use reqwest::Method;
use serde_json::Value;

use crate::Resp;

/// The checked-in document.
pub fn document() -> &'static Value {
    static DOC: OnceLock<Value> = OnceLock::new();
    DOC.get_or_init(|| {
        let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../api/openapi.json");
        let text = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
        serde_json::from_str(&text).expect("api/openapi.json is JSON")
    })
}

/// Every `(operationId, status)` answered so far in this process.
pub fn seen() -> BTreeSet<(String, u16)> {
    SEEN.lock().unwrap_or_else(|e| e.into_inner()).clone()
}

static SEEN: Mutex<BTreeSet<(String, u16)>> = Mutex::new(BTreeSet::new());

/// The operation of `method` on the template `path` matches, or why there is none:
/// `Err(None)` no template matches, `Err(Some(template))` the template lacks the method.
pub fn operation(method: &Method, path: &str) -> Result<(String, &'static Value), Option<String>> {
    let doc = document();
    let path = path.split('?').next().unwrap_or("");
    let segments: Vec<&str> = path.split('/').collect();
    // The most literal template wins (`/v1/cluster/moves` over a `{param}` one).
    let mut best: Option<(usize, &String)> = None;
    for template in doc["paths"].as_object().expect("paths").keys() {
        let t: Vec<&str> = template.split('/').collect();
        if t.len() != segments.len() {
            continue;
        }
        let mut params = 0;
        let fits = t.iter().zip(&segments).all(|(t, s)| {
            if t.starts_with('{') && t.ends_with('}') {
                params += 1;
                !s.is_empty()
            } else {
                t == s
            }
        });
        if fits && best.is_none_or(|(p, _)| params < p) {
            best = Some((params, template));
        }
    }
    let (_, template) = best.ok_or(None)?;
    let op = &doc["paths"][template.as_str()][method.as_str().to_ascii_lowercase()];
    if op.is_object() {
        Ok((template.clone(), op))
    } else {
        Err(Some(template.clone()))
    }
}

/// Resolves a `$ref` into `#/components/…` (or returns `v` itself), with its JSON pointer.
fn resolve(v: &'static Value, at: String) -> (&'static Value, String) {
    match v.get("$ref").and_then(Value::as_str) {
        Some(r) => {
            let pointer = r.trim_start_matches('#').to_string();
            let target = document()
                .pointer(&pointer)
                .unwrap_or_else(|| panic!("api/openapi.json: dangling $ref {r}"));
            (target, pointer)
        }
        None => (v, at),
    }
}

fn escape(s: &str) -> String {
    s.replace('~', "~0").replace('/', "~1")
}

/// A JSON pointer as a URI fragment (the braces of path templates percent-encoded).
fn uri_fragment(pointer: &str) -> String {
    pointer.replace('{', "%7B").replace('}', "%7D")
}

/// A validator of the schema at `pointer` in the document (compiled once).
fn validator(pointer: &str) -> Arc<jsonschema::Validator> {
    static CACHE: OnceLock<Mutex<HashMap<String, Arc<jsonschema::Validator>>>> = OnceLock::new();
    let mut cache = CACHE
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    cache
        .entry(pointer.to_string())
        .or_insert_with(|| {
            // The whole document as the root resource, so that `#/components/schemas/…`
            // references resolve; the root's `$ref` selects the schema to apply.
            let mut root = document().clone();
            root.as_object_mut().unwrap().insert(
                "$ref".into(),
                Value::String(format!("#{}", uri_fragment(pointer))),
            );
            let v = jsonschema::draft202012::options()
                .build(&root)
                .unwrap_or_else(|e| panic!("api/openapi.json: schema at {pointer}: {e}"));
            Arc::new(v)
        })
        .clone()
}

/// Why `resp` (to `method path`) breaks the document, if it does.
pub fn violation(method: &Method, path: &str, resp: &Resp) -> Option<String> {
    if method == Method::HEAD {
        return None;
    }
    let (template, op) = match operation(method, path) {
        Ok(found) => found,
        Err(None) if matches!(resp.status, 404 | 405) => return None,
        // Outside the API (the console's `/ui`): not the document's business.
        Err(None) if !path.starts_with("/v1") => return None,
        // Credentials are checked before routing.
        Err(None) if path.starts_with("/v1") && matches!(resp.status, 401 | 429) => return None,
        Err(None) => return Some(format!("no operation matches, yet {}", resp.status)),
        Err(Some(_)) if resp.status == 405 => return None,
        Err(Some(t)) if t.starts_with("/v1") && matches!(resp.status, 401 | 429) => return None,
        Err(Some(t)) => {
            return Some(format!(
                "{t} declares no {method}, yet the answer is {} (want 405)",
                resp.status
            ))
        }
    };
    let id = op["operationId"].as_str().unwrap_or(&template).to_string();
    let status = resp.status.to_string();
    let Some(declared) = op["responses"].get(&status) else {
        let listed: Vec<&String> = op["responses"].as_object().unwrap().keys().collect();
        return Some(format!(
            "{id}: status {status} is not declared (declared: {listed:?})"
        ));
    };
    SEEN.lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert((id.clone(), resp.status));
    let at = format!(
        "/paths/{}/{}/responses/{status}",
        escape(&template),
        method.as_str().to_ascii_lowercase()
    );
    let (response, at) = resolve(declared, at);
    let content_type = resp
        .header("content-type")
        .unwrap_or_default()
        .to_ascii_lowercase();
    let is_json = content_type.starts_with("application/json");
    match response
        .get("content")
        .and_then(|c| c.get("application/json"))
    {
        Some(media) if media.get("schema").is_some() => {
            if !is_json {
                return Some(format!(
                    "{id} {status}: declared JSON, answered Content-Type {content_type:?}"
                ));
            }
            let body: Value = match serde_json::from_slice(&resp.body) {
                Ok(v) => v,
                Err(e) => return Some(format!("{id} {status}: body is not JSON: {e}")),
            };
            let pointer = format!("{at}/content/application~1json/schema");
            let v = validator(&pointer);
            let errors: Vec<String> = v
                .iter_errors(&body)
                .take(5)
                .map(|e| format!("{} at {}", e, e.instance_path()))
                .collect();
            if !errors.is_empty() {
                return Some(format!(
                    "{id} {status}: the body breaks the declared schema: {}",
                    errors.join("; ")
                ));
            }
        }
        _ if response.get("content").is_none() && !resp.body.is_empty() && is_json => {
            return Some(format!("{id} {status}: declared without a body, got one"));
        }
        _ => {}
    }
    None
}

/// Panics if `resp` breaks the document (see the module doc).
pub fn check(method: &Method, path: &str, resp: &Resp) {
    if let Some(why) = violation(method, path, resp) {
        panic!(
            "the answer breaks the OpenAPI document (api/openapi.json): {why}\n  {}",
            resp.describe()
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn resp(status: u16, content_type: &str, body: &str) -> Resp {
        let mut headers = reqwest::header::HeaderMap::new();
        headers.insert("content-type", content_type.parse().unwrap());
        Resp {
            status,
            headers,
            body: body.as_bytes().to_vec(),
            elapsed: std::time::Duration::ZERO,
            request: "test".into(),
        }
    }

    #[test]
    fn answers_outside_the_document_are_violations() {
        let get = Method::GET;
        let json = "application/json";
        let topic = r#"{"name":"t","partitions":3,"retention_ms":1,"visibility_timeout_ms":1,
            "max_in_flight_per_partition":1,"max_acked_ahead_per_partition":1,"created_at":1,
            "role":"standalone"}"#;
        assert_eq!(
            violation(&get, "/v1/topics/t", &resp(200, json, topic)),
            None
        );
        assert_eq!(
            violation(&get, "/v1/topics/t?partition=1", &resp(200, json, topic)),
            None
        );
        // An undeclared status.
        let v = violation(&get, "/v1/topics/t", &resp(418, json, r#"{"error":"x"}"#));
        assert!(v.unwrap().contains("not declared"));
        // A body that breaks the schema: a required field missing, a wrong type.
        let v = violation(&get, "/v1/topics/t", &resp(200, json, r#"{"name":"t"}"#));
        assert!(v.unwrap().contains("breaks the declared schema"));
        let v = violation(&get, "/v1/topics/t", &resp(404, json, r#"{"error":7}"#));
        assert!(v.unwrap().contains("breaks the declared schema"));
        // Declared JSON, answered as text.
        let v = violation(&get, "/v1/topics/t", &resp(404, "text/plain", "nope"));
        assert!(v.unwrap().contains("Content-Type"));
        // A method the path does not take must be 405; an unknown path 404.
        assert!(violation(&Method::PUT, "/v1/topics/t", &resp(200, json, "{}")).is_some());
        assert_eq!(
            violation(
                &Method::PUT,
                "/v1/topics/t",
                &resp(405, json, r#"{"error":"x"}"#)
            ),
            None
        );
        assert!(violation(&get, "/v1/nowhere", &resp(200, json, "{}")).is_some());
        assert_eq!(
            violation(&get, "/ui/", &resp(200, "text/html", "<html>")),
            None
        );
        // The most literal template wins.
        assert_eq!(
            operation(&get, "/v1/cluster/moves").unwrap().1["operationId"],
            "listMoves"
        );
    }
}
