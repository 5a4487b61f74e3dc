//! The bounded in-memory store behind `store: true` and `previous_response_id`: each stored
//! response keeps its whole object (for `GET /v1/responses/{id}`) and the conversation it
//! continues, as template messages with its own output appended, so a follow-up request only sends
//! its new items. The oldest entries go first when the store passes its count or byte bound; a
//! request that names an evicted or unknown id gets a 400.

use std::collections::VecDeque;
use std::sync::Mutex;

use serde_json::Value;

/// Most responses kept.
const MAX_ENTRIES: usize = 1024;
/// Most bytes kept (serialized size of the objects and conversations).
const MAX_BYTES: usize = 64 << 20;

/// One stored response.
#[derive(Clone, Debug)]
pub struct Stored {
    /// The response object as returned.
    pub response: Value,
    /// The conversation through this response's output (template messages, without the request's
    /// `instructions`, which a follow-up does not inherit).
    pub messages: Vec<Value>,
}

impl Stored {
    fn bytes(&self) -> usize {
        self.response.to_string().len()
            + self
                .messages
                .iter()
                .map(|m| m.to_string().len())
                .sum::<usize>()
    }
}

/// The store: oldest first.
#[derive(Default)]
pub struct ResponseStore {
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    entries: VecDeque<(String, Stored, usize)>,
    bytes: usize,
}

impl ResponseStore {
    /// Keeps `stored` under `id`, evicting the oldest entries past the bounds. An entry larger than
    /// the whole byte bound is not kept.
    pub fn put(&self, id: String, stored: Stored) {
        let size = stored.bytes();
        if size > MAX_BYTES {
            tracing::warn!("response {id} is too large to store ({size} bytes)");
            return;
        }
        let mut g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        while g.entries.len() >= MAX_ENTRIES || g.bytes + size > MAX_BYTES {
            match g.entries.pop_front() {
                Some((_, _, s)) => g.bytes -= s,
                None => break,
            }
        }
        g.bytes += size;
        g.entries.push_back((id, stored, size));
    }

    /// The stored response `id`.
    pub fn get(&self, id: &str) -> Option<Stored> {
        let g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        g.entries
            .iter()
            .find(|(k, _, _)| k == id)
            .map(|(_, s, _)| s.clone())
    }

    /// Forgets `id`; false when it was not stored.
    pub fn remove(&self, id: &str) -> bool {
        let mut g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        match g.entries.iter().position(|(k, _, _)| k == id) {
            Some(i) => {
                if let Some((_, _, s)) = g.entries.remove(i) {
                    g.bytes -= s;
                }
                true
            }
            None => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn oldest_entries_go_first_past_the_count_bound() {
        let s = ResponseStore::default();
        for i in 0..MAX_ENTRIES + 3 {
            s.put(
                format!("resp_{i}"),
                Stored {
                    response: json!({"id": i}),
                    messages: vec![],
                },
            );
        }
        assert!(s.get("resp_0").is_none());
        assert!(s.get("resp_2").is_none());
        assert!(s.get("resp_3").is_some());
        assert!(s.remove("resp_3"));
        assert!(!s.remove("resp_3"));
    }
}
