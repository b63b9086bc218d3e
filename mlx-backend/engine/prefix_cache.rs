//! The prefix cache (SGLang's RadixAttention idea on a per-request KV
//! store): requests whose KV the runner still holds are donors, indexed by
//! the tokens that KV covers. A new request copies the KV of its longest
//! cached prefix ([`ModelRunner::copy_prefix`](crate::runner::ModelRunner::copy_prefix))
//! and prefills only the rest.
//!
//! Two kinds of entries: a *running* request is a donor of its prompt from
//! the end of its prefill (so concurrent requests sharing a system prompt
//! share it at once); a *finished* request's KV is kept (not released) and
//! covers everything it fed. Finished entries are evicted least recently
//! used first whenever admission needs their KV; running ones go with their
//! request. An entry whose tokens are a prefix of another finished entry's
//! is redundant and released at once.
//!
//! The index is a list scanned for the longest common prefix: with the few
//! hundred entries a KV budget holds, a scan costs microseconds next to a
//! forward pass.

use crate::runner::RequestId;
use std::collections::HashMap;

struct Entry {
    tokens: Vec<u32>,
    last_used: u64,
    /// The request still runs: its KV is its own, not evictable.
    running: bool,
}

pub(crate) struct PrefixCache {
    entries: HashMap<RequestId, Entry>,
    clock: u64,
    min_tokens: usize,
    /// Tokens held by finished entries.
    retained_tokens: usize,
}

fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

impl PrefixCache {
    pub fn new(min_tokens: usize) -> PrefixCache {
        PrefixCache {
            entries: HashMap::new(),
            clock: 0,
            min_tokens: min_tokens.max(1),
            retained_tokens: 0,
        }
    }

    fn tick(&mut self) -> u64 {
        self.clock += 1;
        self.clock
    }

    /// The donor holding the longest prefix of `prompt` worth copying, and
    /// how many tokens of it to copy: at most `prompt.len() - 1`, because
    /// the last prompt token must run to give the first sampled token.
    pub fn lookup(&mut self, prompt: &[u32]) -> Option<(RequestId, usize)> {
        let limit = prompt.len().saturating_sub(1);
        let (id, n) = self
            .entries
            .iter()
            .map(|(&id, e)| (id, common_prefix(&e.tokens, prompt).min(limit), e.last_used))
            .filter(|&(_, n, _)| n >= self.min_tokens)
            .max_by_key(|&(_, n, used)| (n, used))
            .map(|(id, n, _)| (id, n))?;
        let now = self.tick();
        if let Some(e) = self.entries.get_mut(&id) {
            e.last_used = now;
        }
        Some((id, n))
    }

    /// A running request's prompt is in its KV now.
    pub fn add_running(&mut self, id: RequestId, prompt: &[u32]) {
        let now = self.tick();
        self.entries.insert(
            id,
            Entry {
                tokens: prompt.to_vec(),
                last_used: now,
                running: true,
            },
        );
    }

    /// A request ended normally holding the KV of `fed`. Returns the ids
    /// whose KV is no longer needed (redundant entries, possibly `id`
    /// itself): the caller releases them from the runner.
    pub fn add_finished(&mut self, id: RequestId, fed: Vec<u32>) -> Vec<RequestId> {
        let mut release = Vec::new();
        // Already covered by a finished entry at least as long: redundant.
        let covered = self.entries.iter().any(|(&other, e)| {
            other != id
                && !e.running
                && e.tokens.len() >= fed.len()
                && common_prefix(&e.tokens, &fed) == fed.len()
        });
        if covered || fed.len() < self.min_tokens {
            self.entries.remove(&id);
            release.push(id);
            return release;
        }
        // Finished entries this one covers are redundant now.
        let redundant: Vec<RequestId> = self
            .entries
            .iter()
            .filter(|(&other, e)| {
                other != id
                    && !e.running
                    && e.tokens.len() <= fed.len()
                    && common_prefix(&e.tokens, &fed) == e.tokens.len()
            })
            .map(|(&other, _)| other)
            .collect();
        for other in redundant {
            if let Some(e) = self.entries.remove(&other) {
                self.retained_tokens -= e.tokens.len();
            }
            release.push(other);
        }
        let now = self.tick();
        self.retained_tokens += fed.len();
        self.entries.insert(
            id,
            Entry {
                tokens: fed,
                last_used: now,
                running: false,
            },
        );
        release
    }

    /// A running request went away (aborted or failed): no longer a donor.
    pub fn remove_running(&mut self, id: RequestId) {
        if self.entries.get(&id).is_some_and(|e| e.running) {
            self.entries.remove(&id);
        }
    }

    /// Take the least recently used finished entry out: the caller releases
    /// it. Returns its id and token count.
    pub fn evict_lru(&mut self) -> Option<(RequestId, usize)> {
        let id = self
            .entries
            .iter()
            .filter(|(_, e)| !e.running)
            .min_by_key(|(_, e)| e.last_used)
            .map(|(&id, _)| id)?;
        let e = self.entries.remove(&id)?;
        self.retained_tokens -= e.tokens.len();
        Some((id, e.tokens.len()))
    }

    /// Take every finished entry out (to release them all).
    pub fn drain(&mut self) -> Vec<RequestId> {
        let ids: Vec<RequestId> = self
            .entries
            .iter()
            .filter(|(_, e)| !e.running)
            .map(|(&id, _)| id)
            .collect();
        for id in &ids {
            self.entries.remove(id);
        }
        self.retained_tokens = 0;
        ids
    }

    /// KV tokens held by finished entries.
    pub fn retained_tokens(&self) -> usize {
        self.retained_tokens
    }

    /// Finished entries.
    pub fn retained_entries(&self) -> usize {
        self.entries.values().filter(|e| !e.running).count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_longest_prefix_wins_and_leaves_one_token_to_run() {
        let mut c = PrefixCache::new(2);
        assert!(c.add_finished(1, vec![1, 2, 3, 4]).is_empty());
        assert!(c.add_finished(2, vec![1, 2, 9, 9, 9]).is_empty());
        assert_eq!(c.lookup(&[1, 2, 3, 4, 5]), Some((1, 4)));
        assert_eq!(c.lookup(&[1, 2, 3, 4]), Some((1, 3)));
        assert_eq!(c.lookup(&[1, 2, 9, 8]), Some((2, 3)));
        assert_eq!(c.lookup(&[1, 7]), None); // below the minimum
        assert_eq!(c.lookup(&[5, 5, 5]), None);
    }

    #[test]
    fn covered_entries_are_released_and_eviction_is_lru() {
        let mut c = PrefixCache::new(1);
        assert!(c.add_finished(1, vec![1, 2]).is_empty());
        // 2 covers 1: 1 is redundant.
        assert_eq!(c.add_finished(2, vec![1, 2, 3]), vec![1]);
        // 3 is covered by 2: released at once.
        assert_eq!(c.add_finished(3, vec![1, 2]), vec![3]);
        assert!(c.add_finished(4, vec![7, 8]).is_empty());
        assert_eq!(c.retained_tokens(), 5);
        c.lookup(&[1, 2, 3, 4]); // 2 used after 4
        assert_eq!(c.evict_lru(), Some((4, 2)));
        assert_eq!(c.evict_lru(), Some((2, 3)));
        assert_eq!(c.evict_lru(), None);
        assert_eq!(c.retained_tokens(), 0);
    }

    #[test]
    fn running_donors_serve_lookups_but_are_never_evicted() {
        let mut c = PrefixCache::new(1);
        c.add_running(5, &[4, 4, 4]);
        assert_eq!(c.lookup(&[4, 4, 4, 1]), Some((5, 3)));
        assert_eq!(c.evict_lru(), None);
        assert_eq!(c.retained_tokens(), 0);
        c.remove_running(5);
        assert_eq!(c.lookup(&[4, 4, 4, 1]), None);
    }
}
