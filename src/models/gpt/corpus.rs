//! A character-level corpus: the vocabulary is the set of characters of the
//! text (sorted), a sample is `seq + 1` consecutive characters starting at
//! a position that is a pure function of (seed, step, sequence index), so
//! every factorisation of the ranks sees the same global batch.

use crate::core::{Error, Result};

/// Text encoded as character ids.
#[derive(Clone, Debug)]
pub struct CharCorpus {
    chars: Vec<char>,
    ids: Vec<i32>,
}

fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

impl CharCorpus {
    /// Errors: a text with fewer than 2 distinct characters or too short to
    /// hold one sample of 2 tokens.
    pub fn new(text: &str) -> Result<Self> {
        let mut chars: Vec<char> = text.chars().collect();
        chars.sort_unstable();
        chars.dedup();
        if chars.len() < 2 {
            return Err(Error::invalid(
                "CharCorpus",
                "text",
                "at least 2 distinct characters",
                chars.len(),
            ));
        }
        let ids: Vec<i32> = text
            .chars()
            .map(|c| chars.binary_search(&c).map_or(0, |i| i as i32))
            .collect();
        if ids.len() < 3 {
            return Err(Error::invalid(
                "CharCorpus",
                "text",
                "at least 3 characters",
                ids.len(),
            ));
        }
        Ok(CharCorpus { chars, ids })
    }

    /// Distinct characters.
    pub fn vocab(&self) -> usize {
        self.chars.len()
    }

    /// Characters of the text.
    pub fn len(&self) -> usize {
        self.ids.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }

    /// Ids of `s` (characters outside the vocabulary are errors).
    pub fn encode(&self, s: &str) -> Result<Vec<i32>> {
        s.chars()
            .map(|c| {
                self.chars.binary_search(&c).map(|i| i as i32).map_err(|_| {
                    Error::invalid("CharCorpus::encode", "s", "characters of the corpus", c)
                })
            })
            .collect()
    }

    /// The text of `ids` (ids outside the vocabulary become `?`).
    pub fn decode(&self, ids: &[i32]) -> String {
        ids.iter()
            .map(|&i| self.chars.get(i as usize).copied().unwrap_or('?'))
            .collect()
    }

    /// The text cut in two: the first `1 - holdout` of its characters for
    /// training, the rest held out (for [`crate::models::gpt::EvalOptions`]),
    /// both with this corpus's vocabulary, so ids mean the same in both.
    /// Errors: `holdout` outside `(0, 1)`, or a part shorter than 3
    /// characters.
    pub fn split_off(&self, holdout: f64) -> Result<(CharCorpus, CharCorpus)> {
        const OP: &str = "CharCorpus::split_off";
        if !(holdout > 0.0 && holdout < 1.0) {
            return Err(Error::invalid(
                OP,
                "holdout",
                "a fraction in (0, 1)",
                holdout,
            ));
        }
        let n = self.ids.len();
        let cut = n - ((n as f64 * holdout).round() as usize).min(n);
        if cut < 3 || n - cut < 3 {
            return Err(Error::invalid(
                OP,
                "holdout",
                format!("a split of {n} characters leaving at least 3 on each side"),
                format!("{cut} + {}", n - cut),
            ));
        }
        let part = |ids: &[i32]| CharCorpus {
            chars: self.chars.clone(),
            ids: ids.to_vec(),
        };
        Ok((part(&self.ids[..cut]), part(&self.ids[cut..])))
    }

    /// Sample `index` of `step`: `seq` input ids and the `seq` next ids.
    /// Errors: a corpus shorter than `seq + 1`.
    pub fn sample(
        &self,
        seed: u64,
        step: u64,
        index: u64,
        seq: usize,
    ) -> Result<(Vec<i32>, Vec<i32>)> {
        if self.ids.len() < seq + 1 {
            return Err(Error::invalid(
                "CharCorpus::sample",
                "seq",
                format!("at most {} for this corpus", self.ids.len() - 1),
                seq,
            ));
        }
        let span = (self.ids.len() - seq) as u64;
        let h = mix(seed ^ mix(step.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ mix(index + 1)));
        let start = (h % span) as usize;
        Ok((
            self.ids[start..start + seq].to_vec(),
            self.ids[start + 1..start + seq + 1].to_vec(),
        ))
    }

    /// `batch` samples `first..first + batch` of `step`, interleaved in
    /// Megatron's `[seq, batch]` order (row `i·batch + j` is position `i` of
    /// sample `j`): `(inputs, targets)`, `seq · batch` ids each.
    pub fn batch(
        &self,
        seed: u64,
        step: u64,
        first: u64,
        batch: usize,
        seq: usize,
    ) -> Result<(Vec<i32>, Vec<i32>)> {
        let mut x = vec![0; seq * batch];
        let mut y = vec![0; seq * batch];
        for j in 0..batch {
            let (a, b) = self.sample(seed, step, first + j as u64, seq)?;
            for i in 0..seq {
                x[i * batch + j] = a[i];
                y[i * batch + j] = b[i];
            }
        }
        Ok((x, y))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodes_decodes_and_samples_shifted_targets() {
        let c = CharCorpus::new("abracadabra").unwrap();
        assert_eq!(c.vocab(), 5);
        assert_eq!(c.decode(&c.encode("cab").unwrap()), "cab");
        assert!(c.encode("z").is_err());
        let (x, y) = c.sample(1, 2, 3, 4).unwrap();
        assert_eq!(&x[1..], &y[..3]);
        assert_eq!(c.sample(1, 2, 3, 4).unwrap(), (x.clone(), y));
        let (bx, _) = c.batch(1, 2, 3, 2, 4).unwrap();
        assert_eq!((0..4).map(|i| bx[i * 2]).collect::<Vec<_>>(), x);
        assert!(c.sample(1, 2, 3, 11).is_err());
    }

    #[test]
    fn split_off_keeps_the_vocabulary_and_every_character_once() {
        let c = CharCorpus::new("abracadabra, abracadabra").unwrap();
        let (train, held) = c.split_off(0.25).unwrap();
        assert_eq!((train.len(), held.len()), (18, 6));
        assert_eq!((train.vocab(), held.vocab()), (c.vocab(), c.vocab()));
        let joined = train.decode(&train.ids) + &held.decode(&held.ids);
        assert_eq!(joined, "abracadabra, abracadabra");
        for bad in [0.0, 1.0, -0.5, f64::NAN, 0.99] {
            let e = c.split_off(bad).unwrap_err().to_string();
            assert!(e.contains("holdout"), "{bad}: {e}");
        }
    }
}
