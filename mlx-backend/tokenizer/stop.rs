//! Stop strings for streamed text: text that could still turn out to be the
//! start of a stop string is held back, so a stop string is never shown,
//! not even in part, and text that is not one is delayed only as long as it
//! could be.

/// What one [`StopStrings::push`] releases.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct StopOutput {
    /// Text safe to show now (never any part of a stop string).
    pub text: String,
    /// A stop string was found: `text` ends right before it, and the
    /// stream is over (later pushes release nothing).
    pub stopped: bool,
}

/// Matches stop strings across the pieces of one streamed text.
#[derive(Debug, Clone, Default)]
pub struct StopStrings {
    stops: Vec<String>,
    /// Text received but not released: the longest suffix that is a
    /// proper prefix of some stop string.
    pending: String,
    stopped: bool,
}

impl StopStrings {
    /// Empty stop strings are ignored (they would match everywhere).
    pub fn new<S: Into<String>>(stops: impl IntoIterator<Item = S>) -> StopStrings {
        StopStrings {
            stops: stops
                .into_iter()
                .map(Into::into)
                .filter(|s: &String| !s.is_empty())
                .collect(),
            pending: String::new(),
            stopped: false,
        }
    }

    /// Whether a stop string has been found.
    pub fn stopped(&self) -> bool {
        self.stopped
    }

    /// Take the next piece of text; returns what can be shown now.
    pub fn push(&mut self, piece: &str) -> StopOutput {
        if self.stopped {
            return StopOutput {
                text: String::new(),
                stopped: true,
            };
        }
        self.pending.push_str(piece);
        // The earliest match in the held-back text plus the new piece. No
        // stop string can start in text already released: that text was
        // released only because no suffix of it began a stop string.
        if let Some(pos) = self
            .stops
            .iter()
            .filter_map(|s| self.pending.find(s.as_str()))
            .min()
        {
            self.stopped = true;
            let mut text = std::mem::take(&mut self.pending);
            text.truncate(pos);
            return StopOutput {
                text,
                stopped: true,
            };
        }
        let keep = self.held_back_len();
        let text = self.pending[..self.pending.len() - keep].to_string();
        self.pending.drain(..self.pending.len() - keep);
        StopOutput {
            text,
            stopped: false,
        }
    }

    /// The end of the stream: releases whatever was held back (it never
    /// became a stop string).
    pub fn finish(&mut self) -> String {
        if self.stopped {
            return String::new();
        }
        std::mem::take(&mut self.pending)
    }

    /// Length in bytes of the longest suffix of `pending` that is a proper
    /// prefix of a stop string (cut at character boundaries).
    fn held_back_len(&self) -> usize {
        let p = &self.pending;
        p.char_indices()
            .map(|(i, _)| &p[i..])
            .find(|suffix| {
                self.stops
                    .iter()
                    .any(|s| s.len() > suffix.len() && s.starts_with(suffix))
            })
            .map_or(0, str::len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feed `pieces`, return (shown text, stopped).
    fn run(stops: &[&str], pieces: &[&str]) -> (String, bool) {
        let mut m = StopStrings::new(stops.iter().copied());
        let mut shown = String::new();
        for p in pieces {
            let out = m.push(p);
            shown.push_str(&out.text);
            if out.stopped {
                return (shown, true);
            }
        }
        shown.push_str(&m.finish());
        (shown, false)
    }

    #[test]
    fn a_stop_string_split_over_pieces_is_never_shown() {
        assert_eq!(
            run(&["there"], &["Hello th", "e", "re!"]),
            ("Hello ".into(), true)
        );
        // Nothing of a partial match is released before it is decided.
        let mut m = StopStrings::new(["there"]);
        assert_eq!(m.push("Hello th").text, "Hello ");
        assert_eq!(m.push("e").text, "");
        assert_eq!(m.push("x").text, "thex");
    }

    #[test]
    fn text_that_only_looked_like_a_stop_is_released() {
        assert_eq!(run(&["END"], &["E", "N", "D?"]), (String::new(), true));
        assert_eq!(run(&["END"], &["E", "N"]), ("EN".into(), false));
        assert_eq!(run(&["END"], &["EN", "E", "ND"]), ("EN".into(), true));
    }

    #[test]
    fn the_earliest_of_several_stops_wins() {
        assert_eq!(run(&["cd", "b"], &["abcd"]), ("a".into(), true));
        assert_eq!(run(&["xyz", "yz"], &["axyz"]), ("a".into(), true));
    }

    #[test]
    fn multibyte_text_is_cut_at_character_boundaries() {
        assert_eq!(run(&["é!"], &["caf", "é", "é!"]), ("café".into(), true));
        assert_eq!(
            run(&["日本"], &["今日", "は日", "曜"]),
            ("今日は日曜".into(), false)
        );
    }

    #[test]
    fn empty_stops_are_ignored_and_nothing_follows_a_stop() {
        assert_eq!(run(&[""], &["abc"]), ("abc".into(), false));
        let mut m = StopStrings::new(["b"]);
        assert!(m.push("ab").stopped);
        assert_eq!(
            m.push("cd"),
            StopOutput {
                text: String::new(),
                stopped: true
            }
        );
        assert_eq!(m.finish(), "");
    }
}
