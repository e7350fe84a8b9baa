//! Query strings as Go's `url.Values` writes them: `&`-separated `k=v`, percent-encoded,
//! `+` for a space. Values are raw bytes (a key may be any bytes). Unknown parameters are
//! ignored; a known one given twice is refused by the handler that reads it.

use percent_encoding::percent_decode;

use crate::error::{ApiError, ApiResult};

/// Parsed query parameters, in order.
#[derive(Debug, Default)]
pub struct Query {
    pairs: Vec<(String, Vec<u8>)>,
}

fn decode(s: &str) -> Vec<u8> {
    let plus: Vec<u8> = s
        .bytes()
        .map(|b| if b == b'+' { b' ' } else { b })
        .collect();
    percent_decode(&plus).collect()
}

impl Query {
    pub fn parse(raw: Option<&str>) -> Self {
        let mut pairs = Vec::new();
        if let Some(raw) = raw {
            for part in raw.split('&').filter(|p| !p.is_empty()) {
                let (k, v) = part.split_once('=').unwrap_or((part, ""));
                pairs.push((String::from_utf8_lossy(&decode(k)).into_owned(), decode(v)));
            }
        }
        Query { pairs }
    }

    /// The single value of `name` (`None` if absent; `400` if repeated).
    pub fn one(&self, name: &str) -> ApiResult<Option<&[u8]>> {
        let mut it = self.pairs.iter().filter(|(k, _)| k == name);
        let first = it.next();
        if it.next().is_some() {
            return Err(ApiError::bad_request(format!(
                "{name} given more than once"
            )));
        }
        Ok(first.map(|(_, v)| v.as_slice()))
    }

    /// The single value of `name` as UTF-8 text.
    pub fn text(&self, name: &str) -> ApiResult<Option<&str>> {
        match self.one(name)? {
            None => Ok(None),
            Some(v) => std::str::from_utf8(v)
                .map(Some)
                .map_err(|_| ApiError::bad_request(format!("{name} is not valid UTF-8"))),
        }
    }

    /// The single value of `name` as a non-negative integer (`400` otherwise).
    pub fn uint(&self, name: &str) -> ApiResult<Option<u64>> {
        match self.text(name)? {
            None => Ok(None),
            Some(s) => s.parse::<u64>().map(Some).map_err(|_| {
                ApiError::bad_request(format!("{name} must be a non-negative integer, got {s:?}"))
            }),
        }
    }

    /// A partition index below `count`.
    pub fn partition(&self, count: u32) -> ApiResult<Option<u32>> {
        match self.uint("partition")? {
            None => Ok(None),
            Some(p) if p < count as u64 => Ok(Some(p as u32)),
            Some(p) => Err(ApiError::bad_request(format!(
                "partition {p} out of range: the topic has {count} partitions"
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_go_url_values() {
        let q = Query::parse(Some("extend=true&key=a%2Fb+c%FF&receipt_handle=1%3A2%3A3"));
        assert_eq!(q.one("key").unwrap().unwrap(), b"a/b c\xff");
        assert_eq!(q.text("receipt_handle").unwrap().unwrap(), "1:2:3");
        assert_eq!(q.text("extend").unwrap().unwrap(), "true");
        assert!(q.one("missing").unwrap().is_none());
    }

    #[test]
    fn repeated_and_bad_values_are_refused() {
        let q = Query::parse(Some("partition=1&partition=2&n=-1&m=x"));
        assert!(q.one("partition").is_err());
        assert!(q.uint("n").is_err());
        assert!(q.uint("m").is_err());
        let q = Query::parse(Some("partition=3"));
        assert!(q.partition(3).is_err());
        assert_eq!(q.partition(4).unwrap(), Some(3));
    }
}
