//! LoRA adapters under tensor parallelism: each adapter's part for every rank held in this
//! process ([`tessera_model::shard_adapter`]: B's rows for the column-parallel projections,
//! A's columns for the row-parallel ones), made once per adapter and kept while the adapter
//! lives. The parts are held beside a weak reference to the whole adapter: once every
//! holder of the adapter (the server's registry, the requests using it) has dropped it, its
//! parts go at the next step, so unloading at run time frees every rank's copy.

use std::collections::HashMap;
use std::sync::{Arc, Weak};

use tessera_core::Result;
use tessera_formats::ModelConfig;
use tessera_lora::LoraAdapter;
use tessera_model::{shard_adapter, TpLayout};

/// Every local rank's part of `adapter`, in rank order (ranks `0..local`).
pub(crate) fn make_parts(
    adapter: &LoraAdapter,
    config: &ModelConfig,
    layout: &TpLayout,
    local: usize,
) -> Result<Vec<Arc<LoraAdapter>>> {
    (0..local)
        .map(|r| shard_adapter(adapter, config, layout, r).map(Arc::new))
        .collect()
}

/// The parts of the adapters in use, by adapter id.
#[derive(Default)]
pub(crate) struct AdapterParts {
    parts: HashMap<u64, (Weak<LoraAdapter>, Vec<Arc<LoraAdapter>>)>,
}

impl AdapterParts {
    /// Keeps `parts` (from [`make_parts`]) for `adapter`.
    pub fn insert(&mut self, adapter: &Arc<LoraAdapter>, parts: Vec<Arc<LoraAdapter>>) {
        self.parts
            .insert(adapter.id, (Arc::downgrade(adapter), parts));
    }

    /// Drops the parts of adapters nobody holds any more; returns their ids.
    pub fn prune(&mut self) -> Vec<u64> {
        let gone: Vec<u64> = self
            .parts
            .iter()
            .filter(|(_, (w, _))| w.strong_count() == 0)
            .map(|(&id, _)| id)
            .collect();
        for id in &gone {
            self.parts.remove(id);
        }
        gone
    }

    /// The step's adapter table for each local rank (`[rank][slot]`), making the parts of
    /// adapters not seen before.
    pub fn tables(
        &mut self,
        adapters: &[Arc<LoraAdapter>],
        config: &ModelConfig,
        layout: &TpLayout,
        local: usize,
    ) -> Result<Vec<Vec<Arc<LoraAdapter>>>> {
        let mut tables = vec![Vec::with_capacity(adapters.len()); local];
        for a in adapters {
            let fresh = match self.parts.get(&a.id) {
                Some((w, p)) if w.strong_count() > 0 && p.len() == local => None,
                _ => Some(make_parts(a, config, layout, local)?),
            };
            if let Some(p) = fresh {
                self.insert(a, p);
            }
            let parts = &self.parts[&a.id].1;
            for (t, p) in tables.iter_mut().zip(parts) {
                t.push(p.clone());
            }
        }
        Ok(tables)
    }

    /// Adapters whose parts are held.
    pub fn len(&self) -> usize {
        self.parts.len()
    }
}
