//! The response store behind `store: true`, `previous_response_id` and
//! `GET`/`DELETE /v1/responses/{id}`: each entry is a response object and its conversation
//! (the input items of the whole chain and the output items), bounded in bytes (their JSON
//! text, plus a small overhead per entry). Past the bound the least recently used entries
//! are evicted; an entry bigger than the whole bound is not kept.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use serde_json::Value;

/// Bytes counted per entry beyond its JSON text (the id twice, the maps' nodes).
const ENTRY_OVERHEAD: usize = 128;

/// A stored response.
#[derive(Clone)]
pub struct Stored {
    /// The response object, as `GET /v1/responses/{id}` returns it.
    pub response: Arc<Value>,
    /// The conversation up to and with this response's output, as input items.
    pub items: Arc<Vec<Value>>,
}

struct Entry {
    stored: Stored,
    bytes: usize,
    /// When it was last used (its key in `order`).
    tick: u64,
}

#[derive(Default)]
struct Inner {
    entries: HashMap<String, Entry>,
    /// Ids by last use, oldest first.
    order: BTreeMap<u64, String>,
    bytes: usize,
    tick: u64,
}

/// A byte-bounded LRU map of responses by id.
pub struct ResponseStore {
    limit: usize,
    inner: Mutex<Inner>,
}

impl ResponseStore {
    pub fn new(limit: usize) -> Self {
        ResponseStore {
            limit,
            inner: Mutex::new(Inner::default()),
        }
    }

    /// The bytes an entry counts for.
    fn size(id: &str, response: &Value, items: &[Value]) -> usize {
        let json_len = |v: &Value| serde_json::to_string(v).map(|s| s.len()).unwrap_or(0);
        ENTRY_OVERHEAD
            + 2 * id.len()
            + json_len(response)
            + items.iter().map(json_len).sum::<usize>()
    }

    /// Keeps `response` and its conversation under `id`, evicting the least recently used
    /// entries as needed; `false` (nothing kept) when it alone is over the bound.
    pub fn put(&self, id: &str, response: Value, items: Vec<Value>) -> bool {
        let bytes = Self::size(id, &response, &items);
        let mut g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        g.remove(id);
        if bytes > self.limit {
            return false;
        }
        while g.bytes + bytes > self.limit {
            let Some((_, oldest)) = g.order.pop_first() else {
                break;
            };
            if let Some(e) = g.entries.remove(&oldest) {
                g.bytes -= e.bytes;
            }
        }
        g.tick += 1;
        let tick = g.tick;
        g.order.insert(tick, id.to_string());
        g.bytes += bytes;
        g.entries.insert(
            id.to_string(),
            Entry {
                stored: Stored {
                    response: Arc::new(response),
                    items: Arc::new(items),
                },
                bytes,
                tick,
            },
        );
        true
    }

    /// The entry under `id`, now the most recently used.
    pub fn get(&self, id: &str) -> Option<Stored> {
        let mut g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        g.tick += 1;
        let tick = g.tick;
        let e = g.entries.get_mut(id)?;
        let old = std::mem::replace(&mut e.tick, tick);
        let stored = e.stored.clone();
        g.order.remove(&old);
        g.order.insert(tick, id.to_string());
        Some(stored)
    }

    /// Removes `id`; whether it was there.
    pub fn delete(&self, id: &str) -> bool {
        self.inner
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(id)
    }

    /// Bytes held now.
    pub fn bytes(&self) -> usize {
        self.inner.lock().unwrap_or_else(|e| e.into_inner()).bytes
    }

    pub fn len(&self) -> usize {
        self.inner
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entries
            .len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Inner {
    fn remove(&mut self, id: &str) -> bool {
        match self.entries.remove(id) {
            Some(e) => {
                self.order.remove(&e.tick);
                self.bytes -= e.bytes;
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

    fn item(n: usize) -> Vec<Value> {
        vec![json!({"type": "message", "role": "user", "content": "x".repeat(n)})]
    }

    #[test]
    fn stays_within_its_bound_evicting_the_least_recently_used() {
        let s = ResponseStore::new(2000);
        assert!(s.put("a", json!({"id": "a"}), item(400)));
        assert!(s.put("b", json!({"id": "b"}), item(400)));
        assert!(s.put("c", json!({"id": "c"}), item(400)));
        assert_eq!(s.len(), 3);
        // `a` used: `b` is now the oldest.
        assert!(s.get("a").is_some());
        assert!(s.put("d", json!({"id": "d"}), item(400)));
        assert!(s.bytes() <= 2000, "{}", s.bytes());
        assert!(s.get("b").is_none(), "the least recently used goes first");
        assert!(s.get("a").is_some() && s.get("c").is_some() && s.get("d").is_some());
        for i in 0..100 {
            s.put(&format!("e{i}"), json!({"id": i}), item(i * 7));
            assert!(s.bytes() <= 2000, "{}", s.bytes());
        }
    }

    #[test]
    fn an_entry_over_the_bound_is_not_kept() {
        let s = ResponseStore::new(1000);
        assert!(s.put("a", json!({}), item(100)));
        assert!(!s.put("big", json!({}), item(5000)));
        assert!(s.get("big").is_none());
        assert!(s.get("a").is_some(), "a refused entry evicts nothing");
        // Replacing an id replaces its bytes.
        let before = s.bytes();
        assert!(s.put("a", json!({}), item(100)));
        assert_eq!(s.bytes(), before);
        assert!(s.delete("a"));
        assert!(!s.delete("a"));
        assert_eq!(s.bytes(), 0);
        assert!(s.is_empty());
    }
}
