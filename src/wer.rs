//! Word error rate with a documented English normalisation, the same on both sides.
//!
//! Normalisation: lower case; `-`, `/` and `:` become spaces; every other character that is not a
//! letter, digit, apostrophe or whitespace is removed; apostrophes at word edges are removed;
//! a number written in digits (0 to 999 999 999) becomes its spoken words ("20" → "twenty",
//! "105" → "one hundred five"), so "twenty" and "20" compare equal; whitespace collapses.

/// Word-level edit counts of one or more utterances.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct WordErrors {
    /// Substitutions + deletions + insertions.
    pub errors: usize,
    /// Words in the normalised reference.
    pub words: usize,
}

impl WordErrors {
    pub fn add(&mut self, other: WordErrors) {
        self.errors += other.errors;
        self.words += other.words;
    }

    /// errors / words (0 for an empty reference with no errors).
    pub fn rate(&self) -> f64 {
        if self.words == 0 {
            return if self.errors == 0 { 0.0 } else { 1.0 };
        }
        self.errors as f64 / self.words as f64
    }
}

/// How many resamples [`delta_interval`] draws, and its seed: fixed, so a report is reproducible.
const BOOTSTRAP_RESAMPLES: usize = 2000;
const BOOTSTRAP_SEED: u64 = 0x0a5e_b007;

/// The 95 % interval of a corpus WER difference (quantized minus full precision, as fractions),
/// by the paired bootstrap over utterances: the utterances are drawn with replacement, each with
/// its two transcripts' errors, and the difference recomputed ([`BOOTSTRAP_RESAMPLES`] times,
/// seeded); the interval is the 2.5th and 97.5th percentiles. It says how far the difference
/// could move on another draw of utterances like these; it knows nothing of the decodings'
/// sensitivity to the last bits of the logits, which moves it too. `None` for no utterances.
pub fn delta_interval(pairs: &[(WordErrors, WordErrors)]) -> Option<[f64; 2]> {
    if pairs.is_empty() {
        return None;
    }
    let mut rng = crate::rng::SplitMix64(BOOTSTRAP_SEED);
    let mut deltas: Vec<f64> = (0..BOOTSTRAP_RESAMPLES)
        .map(|_| {
            let (mut full, mut quantized) = (WordErrors::default(), WordErrors::default());
            for _ in 0..pairs.len() {
                let (f, q) = pairs[rng.below(pairs.len())];
                full.add(f);
                quantized.add(q);
            }
            quantized.rate() - full.rate()
        })
        .collect();
    deltas.sort_by(f64::total_cmp);
    let at =
        |q: f64| deltas[((q * (deltas.len() - 1) as f64).round() as usize).min(deltas.len() - 1)];
    Some([at(0.025), at(0.975)])
}

const ONES: [&str; 20] = [
    "zero",
    "one",
    "two",
    "three",
    "four",
    "five",
    "six",
    "seven",
    "eight",
    "nine",
    "ten",
    "eleven",
    "twelve",
    "thirteen",
    "fourteen",
    "fifteen",
    "sixteen",
    "seventeen",
    "eighteen",
    "nineteen",
];
const TENS: [&str; 10] = [
    "", "", "twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety",
];

fn below_thousand(n: u64, out: &mut Vec<String>) {
    let (hundreds, rest) = (n / 100, n % 100);
    if hundreds > 0 {
        out.push(ONES[hundreds as usize].into());
        out.push("hundred".into());
    }
    if rest >= 20 {
        out.push(TENS[(rest / 10) as usize].into());
        if rest % 10 != 0 {
            out.push(ONES[(rest % 10) as usize].into());
        }
    } else if rest > 0 || hundreds == 0 {
        out.push(ONES[rest as usize].into());
    }
}

/// Spoken words of an integer below one billion.
fn number_words(n: u64) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = n;
    for (scale, name) in [(1_000_000, "million"), (1_000, "thousand")] {
        if rest >= scale {
            below_thousand(rest / scale, &mut out);
            out.push(name.into());
            rest %= scale;
        }
    }
    if rest > 0 || out.is_empty() {
        below_thousand(rest, &mut out);
    }
    out
}

/// The normalised words of a text.
pub fn normalize(text: &str) -> Vec<String> {
    let cleaned: String = text
        .to_lowercase()
        .chars()
        .map(|c| if matches!(c, '-' | '/' | ':') { ' ' } else { c })
        .filter(|c| c.is_alphanumeric() || c.is_whitespace() || *c == '\'')
        .collect();
    let mut words = Vec::new();
    for word in cleaned.split_whitespace() {
        let word = word.trim_matches('\'');
        if word.is_empty() {
            continue;
        }
        match word.parse::<u64>() {
            Ok(n) if n < 1_000_000_000 && word.chars().all(|c| c.is_ascii_digit()) => {
                words.extend(number_words(n))
            }
            _ => words.push(word.to_string()),
        }
    }
    words
}

/// Word edit distance between a reference and a hypothesis, after normalisation.
pub fn word_errors(reference: &str, hypothesis: &str) -> WordErrors {
    let r = normalize(reference);
    let h = normalize(hypothesis);
    let mut prev: Vec<usize> = (0..=h.len()).collect();
    let mut cur = vec![0; h.len() + 1];
    for (i, rw) in r.iter().enumerate() {
        cur[0] = i + 1;
        for (j, hw) in h.iter().enumerate() {
            let sub = prev[j] + usize::from(rw != hw);
            cur[j + 1] = sub.min(prev[j + 1] + 1).min(cur[j] + 1);
        }
        std::mem::swap(&mut prev, &mut cur);
    }
    WordErrors {
        errors: prev[h.len()],
        words: r.len(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn we(errors: usize, words: usize) -> WordErrors {
        WordErrors { errors, words }
    }

    #[test]
    fn delta_interval_is_exact_where_every_resample_agrees() {
        assert_eq!(delta_interval(&[]), None);
        let same = vec![(we(2, 10), we(2, 10)); 30];
        assert_eq!(delta_interval(&same), Some([0.0, 0.0]));
        let one_more = vec![(we(1, 10), we(2, 10)); 30];
        let [low, high] = delta_interval(&one_more).unwrap();
        assert!((low - 0.1).abs() < 1e-12 && (high - 0.1).abs() < 1e-12);
    }

    #[test]
    fn delta_interval_spans_a_difference_carried_by_one_utterance() {
        // One utterance of 20 carries all of a +5-word difference (0.025 of 200 words): a
        // resample leaves it out with probability (19/20)^20 = 0.36, so the interval reaches 0,
        // and draws it twice or more often enough to reach above the point estimate.
        let mut pairs = vec![(we(1, 10), we(1, 10)); 19];
        pairs.push((we(0, 10), we(5, 10)));
        let interval = delta_interval(&pairs).unwrap();
        let [low, high] = interval;
        assert_eq!(low, 0.0);
        assert!(high > 0.025 && high < 0.1, "{interval:?}");
        assert_eq!(delta_interval(&pairs), Some(interval), "seeded");
    }

    #[test]
    fn normalisation_is_case_punctuation_and_number_blind() {
        assert_eq!(
            normalize("Hello, World!  It's 20 past-two."),
            ["hello", "world", "it's", "twenty", "past", "two"]
        );
        assert_eq!(
            normalize("'Quoted' 105 and 1,000"),
            ["quoted", "one", "hundred", "five", "and", "one", "thousand"]
        );
        assert_eq!(
            normalize("0 7 13 40 99 2024"),
            "zero seven thirteen forty ninety nine two thousand twenty four"
                .split(' ')
                .collect::<Vec<_>>()
        );
        assert_eq!(normalize("3000000"), ["three", "million"]);
    }

    #[test]
    fn word_errors_count_substitutions_deletions_and_insertions() {
        assert_eq!(
            word_errors("the cat sat", "The cat sat."),
            WordErrors {
                errors: 0,
                words: 3
            }
        );
        assert_eq!(
            word_errors("the cat sat", "the bat sat down"),
            WordErrors {
                errors: 2,
                words: 3
            }
        );
        assert_eq!(
            word_errors("the cat sat", "cat"),
            WordErrors {
                errors: 2,
                words: 3
            }
        );
        assert_eq!(
            word_errors("twenty one", "21"),
            WordErrors {
                errors: 0,
                words: 2
            }
        );
        assert_eq!(
            word_errors("", "noise"),
            WordErrors {
                errors: 1,
                words: 0
            }
        );
        let mut total = WordErrors::default();
        total.add(word_errors("a b c d", "a b c d"));
        total.add(word_errors("a b c d", "a x c"));
        assert_eq!(
            total,
            WordErrors {
                errors: 2,
                words: 8
            }
        );
        assert_eq!(total.rate(), 0.25);
    }
}
