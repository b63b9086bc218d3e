//! Per-request KV state with a fixed budget in tokens, and a pool of
//! released caches so their buffers are reused rather than reallocated.

use super::batch::RequestId;
use crate::model::{LayerKvCache, Transformer};
use std::collections::HashMap;

/// One request: its per-layer caches and every token it has fed (for penalties).
pub struct RequestState {
    pub caches: Vec<LayerKvCache>,
    pub history: Vec<u32>,
    /// Tokens sampled so far (the random stream's position).
    pub sampled: u64,
}

impl RequestState {
    pub fn cached(&self) -> usize {
        self.caches.first().map_or(0, |c| c.offset() as usize)
    }
}

pub struct KvStore {
    requests: HashMap<RequestId, RequestState>,
    pool: Vec<Vec<LayerKvCache>>,
    pool_limit: usize,
    step: i32,
    pub budget_tokens: usize,
}

impl KvStore {
    pub fn new(budget_tokens: usize, step: i32, pool_limit: usize) -> KvStore {
        KvStore {
            requests: HashMap::new(),
            pool: Vec::new(),
            pool_limit,
            step,
            budget_tokens,
        }
    }

    pub fn get(&self, id: RequestId) -> Option<&RequestState> {
        self.requests.get(&id)
    }

    pub fn get_mut(&mut self, id: RequestId) -> Option<&mut RequestState> {
        self.requests.get_mut(&id)
    }

    pub fn contains(&self, id: RequestId) -> bool {
        self.requests.contains_key(&id)
    }

    pub fn ids(&self) -> Vec<RequestId> {
        self.requests.keys().copied().collect()
    }

    pub fn cached_tokens(&self) -> usize {
        self.requests.values().map(RequestState::cached).sum()
    }

    pub fn active(&self) -> usize {
        self.requests.len()
    }

    pub fn pooled(&self) -> usize {
        self.pool.len()
    }

    /// Start a request with an empty cache (a pooled one when there is one).
    pub fn allocate(&mut self, id: RequestId, model: &Transformer) -> &mut RequestState {
        let caches = self
            .pool
            .pop()
            .unwrap_or_else(|| model.new_caches(self.step));
        self.requests.entry(id).or_insert(RequestState {
            caches,
            history: Vec::new(),
            sampled: 0,
        })
    }

    /// Start `to` with a copy of the first `tokens` positions of `from`'s
    /// caches and history (the caller checked that `from` holds that many and
    /// `to` is new). The copy is evaluated here: a pending graph reading
    /// `from`'s buffers would keep a later fused decode of `from` from
    /// writing them in place.
    pub fn copy_prefix(
        &mut self,
        from: RequestId,
        to: RequestId,
        tokens: usize,
        model: &Transformer,
    ) -> Result<(), super::RunnerError> {
        let n = tokens as i32;
        let src = self.requests.get(&from).expect("checked by the caller");
        let mut slices = Vec::with_capacity(src.caches.len());
        for c in &src.caches {
            let (k, v) = c.buffers().expect("a request holding tokens has buffers");
            slices.push((k.slice_axis(2, 0, n)?, v.slice_axis(2, 0, n)?));
        }
        let history = src.history[..tokens.min(src.history.len())].to_vec();
        let mut caches = self
            .pool
            .pop()
            .unwrap_or_else(|| model.new_caches(self.step));
        let copied = (|| -> Result<(), super::RunnerError> {
            for (c, (k, v)) in caches.iter_mut().zip(&slices) {
                c.update(k, v)?;
            }
            let buffers: Vec<&crate::Array> = caches
                .iter()
                .filter_map(|c| c.buffers())
                .flat_map(|(k, v)| [k, v])
                .collect();
            crate::eval(&buffers)?;
            Ok(())
        })();
        // On failure the buffers may hold part of the copy: not pooled.
        copied?;
        self.requests.insert(
            to,
            RequestState {
                caches,
                history,
                sampled: 0,
            },
        );
        Ok(())
    }

    /// Forget a request; its buffers go to the pool (up to its limit).
    pub fn release(&mut self, id: RequestId) {
        if let Some(mut state) = self.requests.remove(&id) {
            if self.pool.len() < self.pool_limit {
                for c in &mut state.caches {
                    c.truncate(0);
                }
                self.pool.push(state.caches);
            }
        }
    }

    /// Drop pooled buffers (e.g. before measuring memory).
    pub fn clear_pool(&mut self) {
        self.pool.clear();
    }
}
