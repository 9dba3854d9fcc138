//! The `paged-lazy` strategy's settings as `key=value` items, read the same way by
//! `gpumem replay --lazy-conf` and the PyTorch plug-in's `GPUMEM_CONF`
//! ([`gpumem_core::config::LazyConfig`]).
use crate::conf_items::{items, ItemError};
use gpumem_core::config::{LazyConfig, LazyPlacement};

/// `c` as the items [`apply`] reads, every key given (`placement=segments,headroom=0,...`):
/// what `replay --json` and the report say a `paged-lazy` run used.
pub fn text(c: &LazyConfig) -> String {
    format!(
        "placement={},headroom={},max_handle={},map_ahead={},grow_ahead={}",
        c.placement.name(),
        f64::from(c.headroom_bp) / 10_000.0,
        c.handle_bytes,
        c.ahead_bytes,
        f64::from(c.grow_ahead_bp) / 10_000.0,
    )
}

/// `c` for people: the items that take effect under its placement, sizes in binary units
/// (in the form [`apply`] reads: `placement=pages,headroom=0.02,max_handle=1GiB,map_ahead=1GiB`;
/// a size that is not a whole number of its unit is rounded as [`crate::units::bytes_compact`]
/// rounds it, e.g. `2.9MiB`),
/// and what the placement does. `grow_ahead` is named only when set; `headroom`, `max_handle`
/// and `map_ahead` only under `placement=pages`, the one placement that reads them.
pub fn describe(c: &LazyConfig) -> (String, String) {
    match c.placement {
        LazyPlacement::Segments if c.grow_ahead_bp > 0 => (
            format!(
                "placement=segments,grow_ahead={}",
                f64::from(c.grow_ahead_bp) / 10_000.0
            ),
            format!(
                "PyTorch's expandable segments, one handle per growth until the device fills, each growth {}% of the bytes held beyond the request",
                f64::from(c.grow_ahead_bp) / 100.0
            ),
        ),
        LazyPlacement::Segments => (
            "placement=segments".to_string(),
            "PyTorch's expandable segments, one handle per growth until the device fills"
                .to_string(),
        ),
        LazyPlacement::Pages => (
            format!(
                "placement=pages,headroom={},max_handle={},map_ahead={}",
                f64::from(c.headroom_bp) / 10_000.0,
                crate::units::bytes_compact(c.handle_bytes).replace(' ', ""),
                crate::units::bytes_compact(c.ahead_bytes).replace(' ', ""),
            ),
            "gpumem's page placement: freed pages stay mapped and are reused in place".to_string(),
        ),
    }
}

/// The keys [`apply`] knows.
pub const KEYS: [&str; 5] = [
    "placement",
    "headroom",
    "max_handle",
    "map_ahead",
    "grow_ahead",
];

/// Applies one item to `c`: `placement` (`segments` or `pages`), `headroom` (a fraction of
/// the peak of allocated bytes, 0 to 10, e.g. `0.02`), `max_handle` (a size above 0, rounded
/// down to whole pages, at least one page), `map_ahead` (a size; sizes as
/// [`crate::units::parse_size`] reads them), `grow_ahead` (a fraction of the bytes held, 0 to 1,
/// e.g. `0.0156`; placement `segments` only). Returns `Ok(false)` (and changes nothing) for a key that is not one of [`KEYS`].
///
/// # Errors
/// What was expected, for a bad value of a known key (`c` unchanged).
pub fn apply(c: &mut LazyConfig, key: &str, value: &str) -> Result<bool, String> {
    match key {
        "placement" => {
            c.placement = match value {
                "segments" => LazyPlacement::Segments,
                "pages" => LazyPlacement::Pages,
                _ => {
                    return Err("expected segments or pages (segments: PyTorch's expandable segments with one physical handle per growth; pages: gpumem's page placement)".into())
                }
            };
        }
        "headroom" => c.headroom_bp = basis_points(value, 10.0, "0.02")?,
        "max_handle" => {
            let v = crate::units::parse_size(value)?;
            if v == 0 {
                return Err("expected a size above 0 (rounded down to whole pages, at least one page: 2 MiB on an H200)".into());
            }
            c.handle_bytes = v;
        }
        "map_ahead" => c.ahead_bytes = crate::units::parse_size(value)?,
        "grow_ahead" => c.grow_ahead_bp = basis_points(value, 1.0, "0.0156")?,
        _ => return Ok(false),
    }
    Ok(true)
}

/// A fraction from 0 to `max` in basis points (1/10,000, rounded to the nearest); a fraction
/// above 0 that rounds to 0 is refused rather than read as 0.
fn basis_points(value: &str, max: f64, example: &str) -> Result<u32, String> {
    let f: f64 = value
        .parse()
        .ok()
        .filter(|f| (0.0..=max).contains(f))
        .ok_or_else(|| format!("expected a fraction from 0 to {max}, such as {example}"))?;
    let bp = (f * 10_000.0).round() as u32;
    if bp == 0 && f > 0.0 {
        return Err("expected 0 or at least 0.0001 (read in steps of 0.0001)".into());
    }
    Ok(bp)
}

/// Parses `key=value` items separated by commas (spaces around them ignored; split by
/// [`crate::conf_items::items`]) onto the defaults, as `gpumem replay --lazy-conf` reads them.
///
/// # Errors
/// The first bad item ([`ItemError`]: what was wrong and what was expected): not
/// `key=value`, an unknown key, a key given twice, or a bad value for a known key.
pub fn parse(text: &str) -> Result<LazyConfig, ItemError> {
    let mut c = LazyConfig::default();
    let mut seen: Vec<&str> = Vec::new();
    for item in items(text, &KEYS) {
        let (key, value) = item?;
        if seen.contains(&key) {
            return Err(ItemError::Repeated { key: key.into() });
        }
        seen.push(key);
        let known =
            apply(&mut c, key, value).map_err(|why| ItemError::bad_value(key, value, why))?;
        if !known {
            return Err(ItemError::unknown_key(key, &KEYS));
        }
    }
    Ok(c)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn describe_names_the_items_that_take_effect() {
        let mut c = LazyConfig::default();
        assert_eq!(describe(&c).0, "placement=segments");
        c.grow_ahead_bp = 156;
        let (items, what) = describe(&c);
        assert_eq!(items, "placement=segments,grow_ahead=0.0156");
        assert!(what.ends_with("each growth 1.56% of the bytes held beyond the request"));
        c.placement = LazyPlacement::Pages;
        c.handle_bytes = 64 << 20;
        c.headroom_bp = 200;
        let (items, _) = describe(&c);
        assert_eq!(
            items,
            "placement=pages,headroom=0.02,max_handle=64MiB,map_ahead=1GiB"
        );
        // What it prints reads back as the same settings.
        let mut back = LazyConfig::default();
        for item in items.split(',') {
            let (k, v) = item.split_once('=').unwrap();
            assert!(apply(&mut back, k, v).unwrap());
        }
        back.grow_ahead_bp = c.grow_ahead_bp;
        assert_eq!(back, c);
    }

    #[test]
    fn keys_values_and_refusals() {
        let mut c = LazyConfig::default();
        assert_eq!(c.placement, LazyPlacement::Segments);
        assert_eq!(apply(&mut c, "placement", "pages"), Ok(true));
        assert_eq!(c.placement, LazyPlacement::Pages);
        assert_eq!(apply(&mut c, "headroom", "0.02"), Ok(true));
        assert_eq!(apply(&mut c, "max_handle", "64MiB"), Ok(true));
        assert_eq!(apply(&mut c, "map_ahead", "0"), Ok(true));
        assert_eq!(apply(&mut c, "grow_ahead", "0.0156"), Ok(true));
        assert_eq!(
            (
                c.headroom_bp,
                c.handle_bytes,
                c.ahead_bytes,
                c.grow_ahead_bp
            ),
            (200, 64 << 20, 0, 156)
        );
        let before = c;
        assert_eq!(apply(&mut c, "colour", "red"), Ok(false));
        for (k, v) in [
            ("headroom", "2%"),
            ("headroom", "-1"),
            ("headroom", "nan"),
            ("max_handle", "0"),
            ("map_ahead", "lots"),
            ("grow_ahead", "1.5"),
            ("grow_ahead", "-0.01"),
            ("grow_ahead", "0.00001"),
            ("headroom", "0.00004"),
            ("placement", "torch"),
        ] {
            assert!(apply(&mut c, k, v).is_err(), "{k}={v}");
        }
        assert_eq!(c, before, "refused items change nothing");
    }

    #[test]
    fn parse_reads_items_onto_the_defaults_and_names_the_bad_one() {
        let c = parse(" placement=pages , headroom=0.02,,").unwrap();
        assert_eq!((c.placement, c.headroom_bp), (LazyPlacement::Pages, 200));
        assert_eq!(parse("").unwrap(), LazyConfig::default());
        assert_eq!(
            parse("pages").unwrap_err().to_string(),
            "`pages` is not key=value (keys: placement, headroom, max_handle, map_ahead, grow_ahead)"
        );
        assert_eq!(
            parse("colour=red").unwrap_err().to_string(),
            "unknown key `colour` (expected placement, headroom, max_handle, map_ahead or grow_ahead)"
        );
        assert_eq!(
            parse("grow_ahead=0.0156, grow_ahead=0.5")
                .unwrap_err()
                .to_string(),
            "`grow_ahead` is given twice (give each key once)"
        );
        let e = parse("headroom=2%").unwrap_err().to_string();
        assert!(e.contains("bad value `2%` for `headroom`"), "{e}");
    }
}
