//! What rank 0 broadcasts to its followers before each step, as one i32
//! vector (the collectives carry arrays, and i32 sums exactly): a kind,
//! then its fields. u64s travel as two words, floats as their bits, so a
//! follower rebuilds the very batch rank 0 runs.

use crate::distributed::DistributedError;
use crate::runner::{
    ForwardBatch, ForwardMode, RequestId, RequestInput, ReturnOptions, SamplingParams,
};

/// One message of the runner protocol.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Message {
    /// Nothing to do; rank 0 is alive (sent while idle).
    Heartbeat,
    /// Run this batch.
    Forward(ForwardBatch),
    /// Free these requests' KV.
    Release(Vec<RequestId>),
    /// `ModelRunner::copy_prefix(from, to, tokens)`.
    CopyPrefix(RequestId, RequestId, usize),
    /// Rank 0 is shutting down; followers leave their loop.
    Shutdown,
}

const HEARTBEAT: i32 = 1;
const FORWARD: i32 = 2;
const RELEASE: i32 = 3;
const COPY_PREFIX: i32 = 4;
const SHUTDOWN: i32 = 5;

fn push_u64(out: &mut Vec<i32>, v: u64) {
    out.push(v as u32 as i32);
    out.push((v >> 32) as u32 as i32);
}

fn push_f32(out: &mut Vec<i32>, v: f32) {
    out.push(v.to_bits() as i32);
}

fn mode_code(mode: ForwardMode) -> i32 {
    match mode {
        ForwardMode::Extend => 0,
        ForwardMode::Decode => 1,
        ForwardMode::Mixed => 2,
        ForwardMode::Idle => 3,
    }
}

/// `message` as the words to broadcast.
pub(crate) fn encode(message: &Message) -> Vec<i32> {
    let mut out = Vec::new();
    match message {
        Message::Heartbeat => out.push(HEARTBEAT),
        Message::Shutdown => out.push(SHUTDOWN),
        Message::Release(ids) => {
            out.push(RELEASE);
            out.push(ids.len() as i32);
            for &id in ids {
                push_u64(&mut out, id);
            }
        }
        Message::CopyPrefix(from, to, tokens) => {
            out.push(COPY_PREFIX);
            push_u64(&mut out, *from);
            push_u64(&mut out, *to);
            push_u64(&mut out, *tokens as u64);
        }
        Message::Forward(batch) => {
            out.push(FORWARD);
            out.push(mode_code(batch.mode));
            out.push(batch.requests.len() as i32);
            for r in &batch.requests {
                push_u64(&mut out, r.id);
                out.push(r.tokens.len() as i32);
                out.extend(r.tokens.iter().map(|&t| t as i32));
                push_u64(&mut out, r.cached_tokens as u64);
                let s = &r.sampling;
                push_f32(&mut out, s.temperature);
                out.push(s.top_k as i32);
                for v in [
                    s.top_p,
                    s.min_p,
                    s.repetition_penalty,
                    s.presence_penalty,
                    s.frequency_penalty,
                ] {
                    push_f32(&mut out, v);
                }
                out.push(s.logit_bias.len() as i32);
                for &(t, b) in &s.logit_bias {
                    out.push(t as i32);
                    push_f32(&mut out, b);
                }
                out.push(s.seed.is_some() as i32);
                push_u64(&mut out, s.seed.unwrap_or(0));
                out.push(r.returns.logprob as i32);
                out.push(r.returns.top_logprobs as i32);
                out.push(r.returns.logits as i32);
                out.push(r.last_chunk as i32);
            }
        }
    }
    out
}

/// Reads words in order; running out is a protocol error.
struct Reader<'a> {
    words: &'a [i32],
    at: usize,
}

impl Reader<'_> {
    fn i32(&mut self) -> Result<i32, DistributedError> {
        let w = self.words.get(self.at).copied().ok_or_else(|| {
            DistributedError::Protocol(format!("message ends after {} words", self.words.len()))
        })?;
        self.at += 1;
        Ok(w)
    }

    fn len(&mut self) -> Result<usize, DistributedError> {
        let n = self.i32()?;
        usize::try_from(n).map_err(|_| DistributedError::Protocol(format!("negative length {n}")))
    }

    fn u64(&mut self) -> Result<u64, DistributedError> {
        let lo = self.i32()? as u32 as u64;
        let hi = self.i32()? as u32 as u64;
        Ok(lo | (hi << 32))
    }

    fn f32(&mut self) -> Result<f32, DistributedError> {
        Ok(f32::from_bits(self.i32()? as u32))
    }

    fn bool(&mut self) -> Result<bool, DistributedError> {
        Ok(self.i32()? != 0)
    }
}

/// The message broadcast as `words`.
pub(crate) fn decode(words: &[i32]) -> Result<Message, DistributedError> {
    let mut r = Reader { words, at: 0 };
    let message = match r.i32()? {
        HEARTBEAT => Message::Heartbeat,
        SHUTDOWN => Message::Shutdown,
        RELEASE => {
            let n = r.len()?;
            Message::Release((0..n).map(|_| r.u64()).collect::<Result<_, _>>()?)
        }
        COPY_PREFIX => Message::CopyPrefix(r.u64()?, r.u64()?, r.u64()? as usize),
        FORWARD => {
            let mode = match r.i32()? {
                0 => ForwardMode::Extend,
                1 => ForwardMode::Decode,
                2 => ForwardMode::Mixed,
                3 => ForwardMode::Idle,
                m => return Err(DistributedError::Protocol(format!("unknown mode {m}"))),
            };
            let n = r.len()?;
            let mut requests = Vec::with_capacity(n.min(words.len()));
            for _ in 0..n {
                let id = r.u64()?;
                let ntok = r.len()?;
                let tokens = (0..ntok)
                    .map(|_| r.i32().map(|t| t as u32))
                    .collect::<Result<_, _>>()?;
                let cached_tokens = r.u64()? as usize;
                let temperature = r.f32()?;
                let top_k = r.i32()? as u32;
                let (top_p, min_p) = (r.f32()?, r.f32()?);
                let (repetition_penalty, presence_penalty, frequency_penalty) =
                    (r.f32()?, r.f32()?, r.f32()?);
                let nbias = r.len()?;
                let logit_bias = (0..nbias)
                    .map(|_| Ok((r.i32()? as u32, r.f32()?)))
                    .collect::<Result<_, DistributedError>>()?;
                let has_seed = r.bool()?;
                let seed = r.u64()?;
                let returns = ReturnOptions {
                    logprob: r.bool()?,
                    top_logprobs: r.len()?,
                    logits: r.bool()?,
                };
                let last_chunk = r.bool()?;
                requests.push(RequestInput {
                    id,
                    tokens,
                    cached_tokens,
                    sampling: SamplingParams {
                        temperature,
                        top_k,
                        top_p,
                        min_p,
                        repetition_penalty,
                        presence_penalty,
                        frequency_penalty,
                        logit_bias,
                        seed: has_seed.then_some(seed),
                    },
                    returns,
                    last_chunk,
                });
            }
            Message::Forward(ForwardBatch { mode, requests })
        }
        k => {
            return Err(DistributedError::Protocol(format!(
                "unknown message kind {k}"
            )))
        }
    };
    if r.at != words.len() {
        return Err(DistributedError::Protocol(format!(
            "{} words left over after the message",
            words.len() - r.at
        )));
    }
    Ok(message)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_message_round_trips() {
        let mut sampling = SamplingParams {
            temperature: 0.7,
            top_k: 40,
            top_p: 0.9,
            min_p: 0.05,
            repetition_penalty: 1.1,
            presence_penalty: -0.5,
            frequency_penalty: 0.25,
            logit_bias: vec![(7, -100.0), (u32::MAX, 1.5)],
            seed: Some(u64::MAX - 3),
        };
        let a = RequestInput::chunk(u64::MAX, vec![1, 2, u32::MAX], 5, false, sampling.clone())
            .with_returns(ReturnOptions {
                logprob: true,
                top_logprobs: 5,
                logits: true,
            });
        sampling.seed = None;
        let b = RequestInput::decode(3, 9, 1 << 40, sampling);
        for message in [
            Message::Heartbeat,
            Message::Shutdown,
            Message::Release(vec![]),
            Message::Release(vec![1, u64::MAX]),
            Message::CopyPrefix(1, 2, 3),
            Message::Forward(ForwardBatch::idle()),
            Message::Forward(ForwardBatch::new(ForwardMode::Mixed, vec![a, b])),
        ] {
            assert_eq!(decode(&encode(&message)).unwrap(), message);
        }
    }

    #[test]
    fn truncated_or_unknown_messages_are_errors() {
        let words = encode(&Message::Release(vec![1, 2]));
        assert!(matches!(
            decode(&words[..words.len() - 1]),
            Err(DistributedError::Protocol(_))
        ));
        assert!(matches!(decode(&[99]), Err(DistributedError::Protocol(_))));
        assert!(matches!(decode(&[]), Err(DistributedError::Protocol(_))));
        let mut long = encode(&Message::Heartbeat);
        long.push(0);
        assert!(matches!(decode(&long), Err(DistributedError::Protocol(_))));
    }
}
