//! Reading `/metrics` (Prometheus/OpenMetrics text, SPEC §9).

use std::collections::{BTreeMap, BTreeSet};

use crate::http::Http;

/// The samples of an exposition: (metric name, the text between its braces or "", value
/// text), comments skipped.
fn samples(text: &str) -> impl Iterator<Item = (&str, &str, &str)> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .filter_map(|line| match line.split_once('{') {
            Some((name, rest)) => rest
                .rsplit_once('}')
                .map(|(labels, value)| (name, labels, value)),
            None => {
                let (name, value) = line.split_once(' ').unwrap_or((line, ""));
                Some((name, "", value))
            }
        })
}

/// Every series name of an exposition with the label names seen on it.
pub fn series(text: &str) -> BTreeMap<String, BTreeSet<String>> {
    let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (name, labels, _) in samples(text) {
        out.entry(name.to_string()).or_default().extend(
            labels
                .split(',')
                .filter_map(|pair| pair.split_once('='))
                .map(|(k, _)| k.trim().to_string()),
        );
    }
    out
}

/// Sums every sample of metric `name` (any labels) in Prometheus/OpenMetrics text; `None`
/// when there is no sample.
pub fn metric_sum(text: &str, name: &str) -> Option<f64> {
    metric_sum_where(text, name, &[])
}

/// Like [`metric_sum`], over the samples carrying every `(label, value)` of `labels`.
pub fn metric_sum_where(text: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    let mut found = None;
    for (metric, label_text, value) in samples(text) {
        if metric != name {
            continue;
        }
        let has = |k: &str, v: &str| {
            label_text
                .split(',')
                .any(|pair| pair.trim() == format!("{k}=\"{v}\""))
        };
        if !labels.iter().all(|(k, v)| has(k, v)) {
            continue;
        }
        let v: f64 = value
            .split_whitespace()
            .next()
            .and_then(|v| v.parse().ok())?;
        *found.get_or_insert(0.0) += v;
    }
    found
}

impl Http {
    /// `GET /metrics`, expecting `200`; the exposition text.
    pub async fn metrics_text(&self) -> String {
        let r = self.get("/metrics").await;
        r.expect(200);
        r.text()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sums_with_and_without_labels() {
        let text = "# HELP x_total X.\n# TYPE x_total counter\n\
                    x_total{topic=\"a\",partition=\"0\"} 2\n\
                    x_total{topic=\"a\",partition=\"1\"} 3\n\
                    x_total{topic=\"b\",partition=\"0\"} 5\n\
                    y 7\n# EOF\n";
        assert_eq!(metric_sum(text, "x_total"), Some(10.0));
        assert_eq!(
            metric_sum_where(text, "x_total", &[("topic", "a")]),
            Some(5.0)
        );
        assert_eq!(
            metric_sum_where(text, "x_total", &[("topic", "b"), ("partition", "0")]),
            Some(5.0)
        );
        assert_eq!(metric_sum_where(text, "x_total", &[("topic", "c")]), None);
        assert_eq!(metric_sum(text, "y"), Some(7.0));
        assert_eq!(metric_sum(text, "x"), None);
        let s = series(text);
        assert_eq!(s.len(), 2);
        assert_eq!(
            s["x_total"].iter().map(String::as_str).collect::<Vec<_>>(),
            ["partition", "topic"]
        );
        assert!(s["y"].is_empty());
    }
}
