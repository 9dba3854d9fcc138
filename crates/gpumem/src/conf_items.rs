//! Settings written as `key=value` items separated by commas: the syntax of
//! `gpumem replay --lazy-conf` ([`crate::lazy_conf`]) and of the PyTorch plug-in's
//! `GPUMEM_CONF`. Both split items with [`items`] and word what was wrong with one with
//! [`ItemError`], so the two read and refuse an item the same way.

/// What was wrong with one item, and what was expected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ItemError {
    /// An item without `=`.
    #[error("`{item}` is not key=value (keys: {})", keys.join(", "))]
    NotKeyValue {
        /// The item as written (trimmed).
        item: String,
        /// The keys the reader knows.
        keys: &'static [&'static str],
    },
    /// A key the reader does not know.
    #[error("unknown key `{key}` (expected {})", one_of(keys))]
    UnknownKey {
        /// The key as written (trimmed).
        key: String,
        /// The keys the reader knows.
        keys: &'static [&'static str],
    },
    /// A key given more than once (readers that refuse it: `--lazy-conf`).
    #[error("`{key}` is given twice (give each key once)")]
    Repeated {
        /// The key as written (trimmed).
        key: String,
    },
    /// A known key whose value does not parse or is out of range.
    #[error("bad value `{value}` for `{key}`: {why}")]
    BadValue {
        /// The key.
        key: String,
        /// The value as written (trimmed).
        value: String,
        /// What was expected.
        why: String,
    },
}

impl ItemError {
    /// [`ItemError::UnknownKey`] for `key`, among `keys`.
    pub fn unknown_key(key: &str, keys: &'static [&'static str]) -> Self {
        ItemError::UnknownKey {
            key: key.into(),
            keys,
        }
    }

    /// [`ItemError::BadValue`]: `value` of `key`, and what was expected (`why`).
    pub fn bad_value(key: &str, value: &str, why: impl Into<String>) -> Self {
        ItemError::BadValue {
            key: key.into(),
            value: value.into(),
            why: why.into(),
        }
    }
}

/// `a, b or c`.
fn one_of(keys: &[&str]) -> String {
    match keys {
        [] => String::new(),
        [only] => (*only).to_string(),
        [init @ .., last] => format!("{} or {last}", init.join(", ")),
    }
}

/// The items of `text`, in order: split at commas, spaces around items, keys and values
/// trimmed, empty items (`a=1,,b=2`, a trailing comma) skipped. Each is `(key, value)`
/// split at its first `=` (a value may hold more), or [`ItemError::NotKeyValue`] naming
/// `keys`. Whether a key is known, and its value, is the caller's to judge.
pub fn items<'a>(
    text: &'a str,
    keys: &'static [&'static str],
) -> impl Iterator<Item = Result<(&'a str, &'a str), ItemError>> + 'a {
    text.split(',')
        .map(str::trim)
        .filter(|i| !i.is_empty())
        .map(move |item| match item.split_once('=') {
            Some((key, value)) => Ok((key.trim(), value.trim())),
            None => Err(ItemError::NotKeyValue {
                item: item.into(),
                keys,
            }),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEYS: [&str; 3] = ["alpha", "beta", "gamma"];

    #[test]
    fn items_are_trimmed_split_at_the_first_equals_and_empty_ones_skipped() {
        let got: Vec<_> = items(" alpha = 1 ,, beta=x=y , oops ,", &KEYS).collect();
        assert_eq!(
            got,
            [
                Ok(("alpha", "1")),
                Ok(("beta", "x=y")),
                Err(ItemError::NotKeyValue {
                    item: "oops".into(),
                    keys: &KEYS
                }),
            ]
        );
        assert_eq!(items(" , ,", &KEYS).count(), 0);
    }

    #[test]
    fn errors_name_the_item_and_what_was_expected() {
        let e = items("oops", &KEYS).next().unwrap().unwrap_err();
        assert_eq!(
            e.to_string(),
            "`oops` is not key=value (keys: alpha, beta, gamma)"
        );
        assert_eq!(
            ItemError::unknown_key("delta", &KEYS).to_string(),
            "unknown key `delta` (expected alpha, beta or gamma)"
        );
        assert_eq!(
            ItemError::unknown_key("delta", &["alpha"]).to_string(),
            "unknown key `delta` (expected alpha)"
        );
        assert_eq!(
            ItemError::bad_value("alpha", "x", "expected a number").to_string(),
            "bad value `x` for `alpha`: expected a number"
        );
    }
}
