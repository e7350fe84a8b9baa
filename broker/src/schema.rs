//! Topic schemas (SPEC §2.10): compiling JSON Schemas, validating produced bodies, and the
//! backward-compatibility rule for a new version.

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::Mutex;
use serde_json::Value;

/// Compiled validators by (topic id, schema version); versions never change once registered.
#[derive(Default)]
pub struct SchemaCache {
    compiled: Mutex<HashMap<(u64, u32), Arc<jsonschema::Validator>>>,
}

/// Parses and compiles a schema document (draft 2020-12 unless `$schema` names another).
pub fn compile(schema: &str) -> Result<jsonschema::Validator, String> {
    let value: Value =
        serde_json::from_str(schema).map_err(|e| format!("schema is not valid JSON: {e}"))?;
    if !(value.is_object() || value.is_boolean()) {
        return Err("schema must be a JSON object".into());
    }
    jsonschema::validator_for(&value).map_err(|e| format!("invalid schema: {e}"))
}

impl SchemaCache {
    /// The validator of a topic's schema version (compiled once).
    pub fn validator(
        &self,
        topic_id: u64,
        version: u32,
        schema: &str,
    ) -> Result<Arc<jsonschema::Validator>, String> {
        if let Some(v) = self.compiled.lock().get(&(topic_id, version)) {
            return Ok(v.clone());
        }
        let v = Arc::new(compile(schema)?);
        self.compiled.lock().insert((topic_id, version), v.clone());
        Ok(v)
    }

    /// Forgets a deleted topic's validators.
    pub fn forget(&self, topic_id: u64) {
        self.compiled.lock().retain(|(id, _), _| *id != topic_id);
    }
}

/// Validates a produced body against a validator: `Err(reason)` if it is not JSON or does
/// not validate.
pub fn validate(validator: &jsonschema::Validator, body: &[u8]) -> Result<(), String> {
    let instance: Value = serde_json::from_slice(body)
        .map_err(|e| format!("schema validation failed: message is not valid JSON: {e}"))?;
    let first = validator.iter_errors(&instance).next().map(|err| {
        let path = err.instance_path().to_string();
        let at = if path.is_empty() {
            String::new()
        } else {
            format!(" at {path}")
        };
        format!("schema validation failed{at}: {err}")
    });
    match first {
        None => Ok(()),
        Some(reason) => Err(reason),
    }
}

fn type_set(prop: &Value) -> Option<Vec<String>> {
    match prop.get("type") {
        None => None,
        Some(Value::String(s)) => Some(vec![s.clone()]),
        Some(Value::Array(a)) => Some(
            a.iter()
                .filter_map(|v| v.as_str().map(str::to_string))
                .collect(),
        ),
        Some(_) => None,
    }
}

fn widens(old: &Option<Vec<String>>, new: &Option<Vec<String>>) -> bool {
    match (old, new) {
        (_, None) => true,
        (None, Some(_)) => false,
        (Some(o), Some(n)) => o
            .iter()
            .all(|t| n.contains(t) || (t == "integer" && n.iter().any(|x| x == "number"))),
    }
}

/// The compatibility rule for a new schema version: every previous property kept, a
/// property's `type` may only widen (no `type` = unconstrained), nothing newly required.
pub fn check_compatible(old: &str, new: &str) -> Result<(), String> {
    let old: Value =
        serde_json::from_str(old).map_err(|e| format!("stored schema unreadable: {e}"))?;
    let new: Value =
        serde_json::from_str(new).map_err(|e| format!("schema is not valid JSON: {e}"))?;
    let empty = serde_json::Map::new();
    let old_props = old
        .get("properties")
        .and_then(Value::as_object)
        .unwrap_or(&empty);
    let new_props = new
        .get("properties")
        .and_then(Value::as_object)
        .unwrap_or(&empty);
    for (name, old_prop) in old_props {
        let Some(new_prop) = new_props.get(name) else {
            return Err(format!(
                "schema is not backward compatible: property {name:?} was removed"
            ));
        };
        if !widens(&type_set(old_prop), &type_set(new_prop)) {
            return Err(format!(
                "schema is not backward compatible: the type of property {name:?} narrowed"
            ));
        }
    }
    if widens(&type_set(&old), &type_set(&new)).eq(&false) {
        return Err("schema is not backward compatible: the top-level type narrowed".into());
    }
    let required = |v: &Value| -> Vec<String> {
        v.get("required")
            .and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .filter_map(|s| s.as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default()
    };
    let old_req = required(&old);
    if let Some(r) = required(&new).into_iter().find(|r| !old_req.contains(r)) {
        return Err(format!(
            "schema is not backward compatible: property {r:?} is newly required"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validates_bodies() {
        let v =
            compile(r#"{"type":"object","required":["id"],"properties":{"id":{"type":"string"}}}"#)
                .unwrap();
        assert!(validate(&v, br#"{"id":"x"}"#).is_ok());
        assert!(validate(&v, br#"{"id":1}"#).unwrap_err().contains("/id"));
        assert!(validate(&v, br#"{}"#).is_err());
        assert!(validate(&v, b"not json")
            .unwrap_err()
            .contains("not valid JSON"));
        assert!(compile("[1]").is_err());
        assert!(compile(r#"{"type":"no-such-type"}"#).is_err());
    }

    #[test]
    fn supports_defs_and_additional_properties() {
        let v = compile(r##"{"$defs":{"b":{"type":"integer"}},"type":"object","additionalProperties":false,"properties":{"body":{"$ref":"#/$defs/b"}}}"##).unwrap();
        assert!(validate(&v, br#"{"body":3}"#).is_ok());
        assert!(validate(&v, br#"{"body":"x"}"#).is_err());
        assert!(validate(&v, br#"{"other":1}"#).is_err());
    }

    #[test]
    fn compatibility_rule() {
        let old = r#"{"type":"object","required":["a"],"properties":{"a":{"type":"integer"},"b":{"type":"string"}}}"#;
        assert!(check_compatible(old, r#"{"type":"object","required":["a"],"properties":{"a":{"type":"number"},"b":{},"c":{"type":"string"}}}"#).is_ok());
        assert!(check_compatible(
            old,
            r#"{"type":"object","properties":{"a":{"type":"integer"}}}"#
        )
        .unwrap_err()
        .contains("removed"));
        assert!(check_compatible(
            old,
            r#"{"type":"object","properties":{"a":{"type":"string"},"b":{"type":"string"}}}"#
        )
        .unwrap_err()
        .contains("narrowed"));
        assert!(check_compatible(old, r#"{"type":"object","required":["a","b"],"properties":{"a":{"type":"integer"},"b":{"type":"string"}}}"#).unwrap_err().contains("newly required"));
        assert!(check_compatible(
            r#"{"properties":{"a":{}}}"#,
            r#"{"properties":{"a":{"type":"string"}}}"#
        )
        .is_err());
    }
}
