//! Reading `/metrics` (Prometheus/OpenMetrics text, SPEC §9).

use crate::http::Http;

/// Sums every sample of metric `name` (any labels) in Prometheus/OpenMetrics text; `None`
/// when there is no sample.
pub fn metric_sum(text: &str, name: &str) -> Option<f64> {
    metric_sum_where(text, name, &[])
}

/// Like [`metric_sum`], over the samples carrying every `(label, value)` of `labels`.
pub fn metric_sum_where(text: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    let mut found = None;
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let metric = line.split(['{', ' ']).next().unwrap_or("");
        if metric != name {
            continue;
        }
        let (label_text, value) = match line.split_once('{') {
            Some((_, rest)) => match rest.rsplit_once('}') {
                Some((l, v)) => (l, v),
                None => continue,
            },
            None => ("", line.split_once(' ').map(|(_, v)| v).unwrap_or("")),
        };
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
    }
}
