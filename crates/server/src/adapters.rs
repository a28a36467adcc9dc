//! The server's LoRA adapter registry: names clients use in a request's `model` field, mapped
//! to adapter files, with at most `max_loras` adapters resident and the least recently used
//! one evicted beyond that. An evicted adapter is reloaded from its file when asked for
//! again, on the blocking pool (never on the step thread); its request waits meanwhile.
//! A request holds its adapter until it finishes, so unloading or evicting an adapter never
//! changes the output of requests already running with it.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use tessera_engine::request::LoraAdapter;
use tessera_engine::AdapterPreparer;
use tessera_formats::ModelConfig;

use crate::api::ApiError;
use crate::text::quote;

struct Entry {
    path: PathBuf,
    resident: Option<Arc<LoraAdapter>>,
    last_used: u64,
    requests: u64,
}

#[derive(Default)]
struct State {
    entries: BTreeMap<String, Entry>,
    clock: u64,
}

pub struct AdapterRegistry {
    base: Arc<ModelConfig>,
    base_name: String,
    max_loras: usize,
    /// Under tensor parallelism, what makes each loaded adapter's per-rank parts (on the
    /// loading thread, before the adapter's first step).
    prepare: Option<AdapterPreparer>,
    state: Mutex<State>,
}

/// One registered adapter, for `/v1/models` and `/metrics`.
pub struct AdapterInfo {
    pub name: String,
    pub path: PathBuf,
    pub resident: bool,
    pub requests: u64,
}

impl AdapterRegistry {
    /// A registry for `base`; `prepare` makes tensor-parallel parts of each adapter loaded.
    pub fn new(
        base: ModelConfig,
        base_name: &str,
        max_loras: usize,
        prepare: Option<AdapterPreparer>,
    ) -> Self {
        AdapterRegistry {
            base: Arc::new(base),
            base_name: base_name.to_string(),
            max_loras: max_loras.max(1),
            prepare,
            state: Mutex::new(State::default()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Reads and checks an adapter file, on the blocking pool.
    async fn read(&self, path: &Path) -> Result<Arc<LoraAdapter>, ApiError> {
        let (base, p) = (self.base.clone(), path.to_path_buf());
        let prepare = self.prepare.clone();
        let loaded = tokio::task::spawn_blocking(move || {
            let a = Arc::new(LoraAdapter::load(&p, &base)?);
            if let Some(prep) = prepare {
                prep.prepare(&a)?;
            }
            Ok::<_, tessera_core::Error>(a)
        })
        .await
        .map_err(|e| ApiError::new(500, "server_error", format!("loading the adapter: {e}")))?;
        loaded.map_err(|e| {
            ApiError::new(
                400,
                "invalid_request_error",
                format!(
                    "cannot load the LoRA adapter {}: {e}",
                    quote(&path.display().to_string())
                ),
            )
        })
    }

    /// Makes `adapter` resident under `name`, evicting the least recently used others
    /// beyond `max_loras`.
    fn insert(&self, st: &mut State, name: &str, path: PathBuf, adapter: Arc<LoraAdapter>) {
        st.clock += 1;
        let clock = st.clock;
        let requests = st.entries.get(name).map_or(0, |e| e.requests);
        st.entries.insert(
            name.to_string(),
            Entry {
                path,
                resident: Some(adapter),
                last_used: clock,
                requests,
            },
        );
        loop {
            let resident: Vec<(&String, u64)> = st
                .entries
                .iter()
                .filter(|(_, e)| e.resident.is_some())
                .map(|(n, e)| (n, e.last_used))
                .collect();
            if resident.len() <= self.max_loras {
                break;
            }
            let victim = resident
                .into_iter()
                .filter(|(n, _)| n.as_str() != name)
                .min_by_key(|(_, t)| *t)
                .map(|(n, _)| n.clone());
            match victim {
                Some(v) => {
                    tracing::info!(
                        "evicting LoRA adapter {v} (more than {} resident)",
                        self.max_loras
                    );
                    if let Some(e) = st.entries.get_mut(&v) {
                        e.resident = None;
                    }
                }
                None => break,
            }
        }
    }

    /// Loads `name` from `path` at start-up (`--lora NAME=PATH`), on the calling thread.
    pub fn preload(&self, name: &str, path: &Path) -> Result<(), String> {
        let mut st = self.lock();
        if name == self.base_name || st.entries.contains_key(name) {
            return Err(format!("--lora {name}: the name is taken"));
        }
        let adapter = Arc::new(
            LoraAdapter::load(path, &self.base)
                .map_err(|e| format!("--lora {name}={}: {e}", path.display()))?,
        );
        if let Some(prep) = &self.prepare {
            prep.prepare(&adapter)
                .map_err(|e| format!("--lora {name}={}: {e}", path.display()))?;
        }
        self.insert(&mut st, name, path.to_path_buf(), adapter);
        Ok(())
    }

    /// Loads the adapter at `path` as `name` (`POST /v1/load_lora_adapter`).
    pub async fn load(&self, name: &str, path: &Path) -> Result<(), ApiError> {
        if name.is_empty() || name == self.base_name {
            return Err(ApiError::invalid(
                "lora_name",
                format!(
                    "{} cannot name an adapter (it is empty or the base model's name)",
                    quote(name)
                ),
            ));
        }
        if self.lock().entries.contains_key(name) {
            return Err(ApiError::invalid(
                "lora_name",
                format!("the LoRA adapter {} has already been loaded", quote(name)),
            ));
        }
        let adapter = self.read(path).await?;
        let mut st = self.lock();
        if st.entries.contains_key(name) {
            return Err(ApiError::invalid(
                "lora_name",
                format!("the LoRA adapter {} has already been loaded", quote(name)),
            ));
        }
        self.insert(&mut st, name, path.to_path_buf(), adapter);
        Ok(())
    }

    /// Forgets `name` (`POST /v1/unload_lora_adapter`); requests running with it finish with
    /// it. Returns how many of its requests are still running.
    pub fn unload(&self, name: &str) -> Result<usize, ApiError> {
        let mut st = self.lock();
        let Some(e) = st.entries.remove(name) else {
            return Err(ApiError {
                status: 404,
                message: format!("the LoRA adapter {} is not loaded", quote(name)),
                param: Some("lora_name".into()),
                kind: "invalid_request_error",
                code: None,
            });
        };
        // The registry's own reference is gone; what is left is held by running requests.
        Ok(e.resident.map_or(0, |a| Arc::strong_count(&a) - 1))
    }

    /// The adapter a request's `model` field names: `None` for the base model (or no
    /// name), 404 naming an unknown one; an evicted adapter is reloaded.
    pub async fn resolve(&self, model: Option<&str>) -> Result<Option<Arc<LoraAdapter>>, ApiError> {
        let name = match model {
            None => return Ok(None),
            Some(m) if m == self.base_name => return Ok(None),
            Some(m) => m,
        };
        let path = {
            let mut st = self.lock();
            st.clock += 1;
            let clock = st.clock;
            let Some(e) = st.entries.get_mut(name) else {
                let known: Vec<String> = std::iter::once(self.base_name.clone())
                    .chain(st.entries.keys().cloned())
                    .collect();
                return Err(ApiError {
                    status: 404,
                    message: format!(
                        "the model {} does not exist (this server serves {})",
                        quote(name),
                        known
                            .iter()
                            .map(|k| quote(k))
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                    param: Some("model".into()),
                    kind: "invalid_request_error",
                    code: None,
                });
            };
            e.requests += 1;
            e.last_used = clock;
            if let Some(a) = &e.resident {
                return Ok(Some(a.clone()));
            }
            e.path.clone()
        };
        tracing::info!(
            "reloading evicted LoRA adapter {name} from {}",
            path.display()
        );
        let adapter = self.read(&path).await?;
        let mut st = self.lock();
        match st.entries.get(name) {
            // Unloaded while it was reading: the request still runs with what it asked for.
            None => Ok(Some(adapter)),
            Some(e) if e.path != path => Ok(Some(adapter)),
            Some(e) => {
                if let Some(a) = &e.resident {
                    return Ok(Some(a.clone()));
                }
                self.insert(&mut st, name, path, adapter.clone());
                Ok(Some(adapter))
            }
        }
    }

    pub fn list(&self) -> Vec<AdapterInfo> {
        self.lock()
            .entries
            .iter()
            .map(|(n, e)| AdapterInfo {
                name: n.clone(),
                path: e.path.clone(),
                resident: e.resident.is_some(),
                requests: e.requests,
            })
            .collect()
    }

    /// Prometheus lines: resident adapters and requests per adapter.
    pub fn render_metrics(&self) -> String {
        let list = self.list();
        let mut s = String::new();
        s.push_str("# HELP tessera_lora_adapters_resident LoRA adapters loaded in memory.\n");
        s.push_str("# TYPE tessera_lora_adapters_resident gauge\n");
        s.push_str(&format!(
            "tessera_lora_adapters_resident {}\n",
            list.iter().filter(|a| a.resident).count()
        ));
        s.push_str(
            "# HELP tessera_lora_adapters_registered LoRA adapters that can be requested.\n",
        );
        s.push_str("# TYPE tessera_lora_adapters_registered gauge\n");
        s.push_str(&format!(
            "tessera_lora_adapters_registered {}\n",
            list.len()
        ));
        s.push_str("# HELP tessera_lora_requests_total Requests per LoRA adapter.\n");
        s.push_str("# TYPE tessera_lora_requests_total counter\n");
        let escape = |n: &str| {
            n.replace('\\', "\\\\")
                .replace('"', "\\\"")
                .replace('\n', "\\n")
        };
        for a in &list {
            s.push_str(&format!(
                "tessera_lora_requests_total{{adapter=\"{}\"}} {}\n",
                escape(&a.name),
                a.requests
            ));
        }
        s
    }
}

/// A map from names to paths parsed from `--lora NAME=PATH` flags.
pub fn parse_lora_flags(flags: &[String]) -> Result<Vec<(String, PathBuf)>, String> {
    let mut seen = HashMap::new();
    flags
        .iter()
        .map(|f| {
            let (n, p) = f
                .split_once('=')
                .filter(|(n, p)| !n.is_empty() && !p.is_empty())
                .ok_or_else(|| format!("--lora {f:?}: expected NAME=PATH"))?;
            if seen.insert(n.to_string(), ()).is_some() {
                return Err(format!("--lora: the name {n:?} is given twice"));
            }
            Ok((n.to_string(), PathBuf::from(p)))
        })
        .collect()
}
