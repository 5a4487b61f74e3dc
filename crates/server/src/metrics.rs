//! `/metrics`: request counters kept here, engine counters from [`hearth_engine::Stats`], written
//! in the Prometheus text format with `hearth_` names.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::Mutex;

use hearth_engine::Stats;

/// Requests answered, by endpoint and status.
#[derive(Default, Debug)]
pub struct Metrics {
    requests: Mutex<BTreeMap<(String, u16), u64>>,
}

impl Metrics {
    /// Counts one answered request.
    pub fn request(&self, endpoint: &str, status: u16) {
        if let Ok(mut m) = self.requests.lock() {
            *m.entry((endpoint.to_string(), status)).or_insert(0) += 1;
        }
    }

    /// The Prometheus text exposition of the counters and `stats`.
    pub fn render(
        &self,
        stats: Option<&Stats>,
        conns: Option<&crate::listen::ConnStats>,
    ) -> String {
        let mut o = String::new();
        let head = |o: &mut String, name: &str, kind: &str, help: &str| {
            let _ = writeln!(
                o,
                "# HELP hearth_{name} {help}\n# TYPE hearth_{name} {kind}"
            );
        };
        head(
            &mut o,
            "requests_total",
            "counter",
            "HTTP requests answered, by endpoint and status.",
        );
        if let Ok(m) = self.requests.lock() {
            for ((ep, st), n) in m.iter() {
                let ep = ep.replace('\\', "\\\\").replace('"', "\\\"");
                let _ = writeln!(
                    o,
                    "hearth_requests_total{{endpoint=\"{ep}\",status=\"{st}\"}} {n}"
                );
            }
        }
        if let Some(c) = conns {
            head(
                &mut o,
                "open_connections",
                "gauge",
                "Client connections open.",
            );
            let _ = writeln!(o, "hearth_open_connections {}", c.open());
            head(
                &mut o,
                "refused_connections_total",
                "counter",
                "Connections answered 503 because every connection slot was busy.",
            );
            let _ = writeln!(o, "hearth_refused_connections_total {}", c.refused());
        }
        let Some(s) = stats else {
            return o;
        };
        let rate = |n: u64, secs: f64| if secs > 0.0 { n as f64 / secs } else { 0.0 };
        let rows: [(&str, &str, &str, f64); 15] = [
            (
                "prompt_tokens_total",
                "counter",
                "Prompt tokens computed (not served from the prefix cache).",
                s.prompt_tokens as f64,
            ),
            (
                "cached_prompt_tokens_total",
                "counter",
                "Prompt tokens served from the prefix cache.",
                s.cached_tokens as f64,
            ),
            (
                "prefix_cache_queries_total",
                "counter",
                "Requests that looked their prompt up in the prefix cache.",
                s.prefix_queries as f64,
            ),
            (
                "prefix_cache_query_tokens_total",
                "counter",
                "Prompt tokens looked up in the prefix cache (all but each prompt's last, which is always computed); hits are cached_prompt_tokens_total.",
                s.prefix_query_tokens as f64,
            ),
            (
                "prefix_cache_disk_tokens_total",
                "counter",
                "Of the cached prompt tokens, those read back from the disk cache (--cache-dir).",
                s.disk_cached_tokens as f64,
            ),
            (
                "generated_tokens_total",
                "counter",
                "Tokens generated.",
                s.generated_tokens as f64,
            ),
            (
                "prefill_tokens_per_second",
                "gauge",
                "Prompt tokens per second of prefill time, since start.",
                rate(s.prompt_tokens, s.prefill_seconds),
            ),
            (
                "decode_tokens_per_second",
                "gauge",
                "Generated tokens per second of decode time, since start.",
                rate(s.generated_tokens, s.decode_seconds),
            ),
            (
                "queue_depth",
                "gauge",
                "Requests waiting for a sequence slot.",
                s.queued as f64,
            ),
            (
                "active_sequences",
                "gauge",
                "Sequences generating now.",
                s.active as f64,
            ),
            (
                "kv_cache_used_cells",
                "gauge",
                "KV cache cells in use.",
                s.kv_used as f64,
            ),
            (
                "kv_cache_capacity_cells",
                "gauge",
                "KV cache capacity in cells.",
                s.kv_capacity as f64,
            ),
            (
                "kv_pool_held_blocks",
                "gauge",
                "KV pool blocks held by running sequences.",
                s.kv_held_blocks as f64,
            ),
            (
                "kv_pool_cached_blocks",
                "gauge",
                "KV pool blocks kept as prefix cache (held by no sequence).",
                s.kv_cached_blocks as f64,
            ),
            (
                "kv_cache_usage_ratio",
                "gauge",
                "Fraction of the KV cache in use.",
                if s.kv_capacity > 0 {
                    s.kv_used as f64 / s.kv_capacity as f64
                } else {
                    0.0
                },
            ),
        ];
        for (name, kind, help, v) in rows {
            head(&mut o, name, kind, help);
            let _ = writeln!(o, "hearth_{name} {v}");
        }
        head(
            &mut o,
            "expert_load_total",
            "counter",
            "MoE routings (token, layer) per expert.",
        );
        for (i, n) in s.expert_load.iter().enumerate() {
            let _ = writeln!(o, "hearth_expert_load_total{{expert=\"{i}\"}} {n}");
        }
        o
    }
}
