//! Format detection from the content of a file, not from its name.
//!
//! Order of the checks: gzip magic (`1f 8b`, inflated by the caller, then detected again), the
//! pickle `PROTO` byte `0x80` (protocol 2 and later) or a text-protocol pickle that starts with
//! `(`, `}` or `]` and ends with `.`, an RMM CSV header (`Thread,Time,Action,Pointer,...`), and a
//! line starting with `{` (JSON lines). Anything else is named: an empty file, an archive (ZIP,
//! tar) or other compression, a Git LFS pointer, an HTML page, other text or binary data.
use super::{Format, TraceError};
use std::io::Read;

/// The two magic bytes that start a gzip member (RFC 1952, section 2.3.1).
pub const GZIP_MAGIC: [u8; 2] = [0x1f, 0x8b];
/// The pickle `PROTO` opcode that starts every pickle of protocol 2 or later.
pub const PICKLE_PROTO: u8 = 0x80;
/// The magic of a POSIX (ustar) or GNU tar header, at [`TAR_MAGIC_OFFSET`] of the archive.
pub const TAR_MAGIC: &[u8] = b"ustar";
/// Where [`TAR_MAGIC`] lies in a tar header (POSIX.1-1988, `magic` field).
pub const TAR_MAGIC_OFFSET: usize = 257;
/// The first line of a Git LFS pointer file.
pub const LFS_POINTER: &[u8] = b"version https://git-lfs.github.com/spec/";

/// Whether `bytes` start with the gzip magic.
pub fn is_gzip(bytes: &[u8]) -> bool {
    bytes.starts_with(&GZIP_MAGIC)
}

/// How many bytes (inflated, for gzip) [`read_sniffed`] looks at before it reads the rest.
pub const SNIFF_BYTES: usize = 64 << 10;

/// Inflated bytes a gzip file may give at least, whatever its size: 1 GiB.
pub const MIN_INFLATE_LIMIT_BYTES: u64 = 1 << 30;
/// Inflated bytes a gzip file may give per compressed byte. Memory snapshots compress 10 to 20
/// times; a decompression bomb (zeros) a thousand times.
pub const MAX_INFLATE_RATIO: u64 = 100;

/// Inflates a gzip file (all its members) in memory.
///
/// # Errors
/// [`TraceError::Malformed`] (index 0) when the gzip data is truncated or corrupt;
/// [`TraceError::NotATrace`] when it inflates past the limit of [`read_sniffed`].
pub fn gunzip(name: &str, bytes: &[u8]) -> Result<Vec<u8>, TraceError> {
    let limit = inflate_limit(bytes.len() as u64);
    let mut out = Vec::with_capacity(bytes.len().saturating_mul(8));
    read_limited(
        name,
        flate2::read::MultiGzDecoder::new(bytes),
        &mut out,
        Some((limit, bytes.len() as u64)),
    )?;
    Ok(out)
}

/// The most inflated bytes accepted from `compressed` bytes of gzip.
pub fn inflate_limit(compressed: u64) -> u64 {
    compressed
        .saturating_mul(MAX_INFLATE_RATIO)
        .max(MIN_INFLATE_LIMIT_BYTES)
}

/// Reads `reader` to its end into `out`; with `gzip = Some((limit, compressed))`, refuses to
/// inflate past `limit` bytes and names gzip in read errors.
fn read_limited(
    name: &str,
    reader: impl Read,
    out: &mut Vec<u8>,
    gzip: Option<(u64, u64)>,
) -> Result<(), TraceError> {
    let Some((limit, compressed)) = gzip else {
        let mut reader = reader;
        return reader
            .read_to_end(out)
            .map(|_| ())
            .map_err(|source| TraceError::Io {
                path: name.to_string(),
                source,
            });
    };
    let before = out.len() as u64;
    let mut r = reader.take(limit.saturating_sub(before).saturating_add(1));
    r.read_to_end(out).map_err(|e| TraceError::Malformed {
        path: name.to_string(),
        index: 0,
        message: gzip_damage(out.len(), &e),
    })?;
    if out.len() as u64 > limit {
        return Err(bomb(name, limit, compressed));
    }
    Ok(())
}

fn bomb(name: &str, limit: u64, compressed: u64) -> TraceError {
    TraceError::NotATrace {
        path: name.to_string(),
        what: format!(
            "gzip data that inflates past {limit} bytes ({MAX_INFLATE_RATIO} times its \
             {compressed} compressed bytes, and at least {MIN_INFLATE_LIMIT_BYTES}): a \
             decompression bomb, or an unusually repetitive file; gpumem stopped reading there. \
             To read it anyway, decompress it yourself (gunzip -k) and pass the result"
        ),
    }
}

/// Where a gzip stream broke: `gzip data truncated or corrupt after N inflated bytes: why`.
fn gzip_damage(inflated: usize, e: &std::io::Error) -> String {
    format!("gzip data truncated or corrupt after {inflated} inflated bytes: {e}")
}

/// What [`read_sniffed`] read.
#[derive(Debug)]
pub struct Sniffed {
    /// The (inflated) bytes.
    pub data: Vec<u8>,
    /// Their format.
    pub format: Format,
    /// Whether they came out of gunzip (byte offsets into `data` are not offsets into the
    /// file).
    pub gunzipped: bool,
    /// The gzip stream ended early or broke, and `data` is what it gave before that (the
    /// message says where); [`read_sniffed`] keeps such data only when `lenient`.
    pub gzip_cut: Option<String>,
}

/// Reads a trace from `reader`, deciding from its first bytes (after gunzip, streamed) whether
/// it can be a trace before reading the rest: random data, an archive or a gzip of zeros is
/// refused after [`SNIFF_BYTES`] bytes at most. A gzip stream may inflate to
/// [`inflate_limit`] of its size (`compressed_hint` when known, else what was read so far).
/// With `lenient`, a gzip stream that is cut short or corrupt gives what it inflated before.
///
/// # Errors
/// [`TraceError::Io`] when reading fails; [`TraceError::NotATrace`] for data that is not a
/// trace (named as [`detect`] names it) or a gzip bomb; [`TraceError::Malformed`] for corrupt
/// or truncated gzip data (unless `lenient` and some data came before the damage).
pub fn read_sniffed(
    name: &str,
    reader: impl Read,
    compressed_hint: Option<u64>,
    lenient: bool,
) -> Result<Sniffed, TraceError> {
    let sniffed = sniff(name, reader, compressed_hint)?;
    match sniffed.gzip_cut {
        Some(cut) if !lenient => Err(TraceError::Malformed {
            path: name.to_string(),
            index: 0,
            message: cut,
        }),
        _ => Ok(sniffed),
    }
}

/// [`read_sniffed`] that always keeps what a broken gzip stream gave before the damage (in
/// [`Sniffed::gzip_cut`]) when that is enough to detect a format: the caller decides, from
/// what a lenient read of it keeps, whether a strict read's error suggests a lenient one.
///
/// # Errors
/// As [`read_sniffed`] with `lenient`.
pub(crate) fn sniff(
    name: &str,
    mut reader: impl Read,
    compressed_hint: Option<u64>,
) -> Result<Sniffed, TraceError> {
    let io = |source| TraceError::Io {
        path: name.to_string(),
        source,
    };
    let mut head = Vec::with_capacity(SNIFF_BYTES);
    reader
        .by_ref()
        .take(SNIFF_BYTES as u64)
        .read_to_end(&mut head)
        .map_err(io)?;
    let not_a_trace = |what: String| TraceError::NotATrace {
        path: name.to_string(),
        what,
    };
    if !is_gzip(&head) {
        let complete = head.len() < SNIFF_BYTES;
        detect_with(&head, complete).map_err(not_a_trace)?;
        let mut data = head;
        read_limited(name, reader, &mut data, None)?;
        let format = detect(&data).map_err(not_a_trace)?;
        return Ok(Sniffed {
            data,
            format,
            gunzipped: false,
            gzip_cut: None,
        });
    }
    // Gzip: inflate a chunk at a time; look at the first bytes before going on. The limit
    // grows with the compressed bytes read so far when the size is not known in advance
    // (standard input).
    let counted = Counted {
        inner: std::io::Cursor::new(head).chain(reader),
        bytes: 0,
    };
    let mut gz = Members::new(std::io::BufReader::with_capacity(1 << 16, counted));
    let mut data: Vec<u8> = Vec::with_capacity(SNIFF_BYTES);
    let mut chunk = vec![0u8; 1 << 16];
    let mut sniffed = false;
    let mut gzip_cut = None;
    loop {
        let n = match gz.read(&mut chunk) {
            Ok(n) => n,
            Err(e) => {
                let what = match e.get_ref().and_then(|x| x.downcast_ref::<TrailingData>()) {
                    Some(t) => format!(
                        "the gzip data ends after {} inflated bytes, then {t}",
                        data.len()
                    ),
                    None => gzip_damage(data.len(), &e),
                };
                if data.len() >= SNIFF_BYTES.min(64) {
                    gzip_cut = Some(what);
                    break;
                }
                return Err(TraceError::Malformed {
                    path: name.to_string(),
                    index: 0,
                    message: what,
                });
            }
        };
        data.extend_from_slice(&chunk[..n]);
        if !sniffed && (n == 0 || data.len() >= SNIFF_BYTES) {
            sniffed = true;
            if is_gzip(&data) {
                return Err(not_a_trace(
                    "after gunzip, gzip data again: the file was compressed twice; decompress it \
                     once (gunzip -c FILE > ONCE.gz) and pass the result"
                        .to_string(),
                ));
            }
            detect_with(&data, n == 0)
                .map_err(|what| not_a_trace(format!("after gunzip, {what}")))?;
        }
        if n == 0 {
            break;
        }
        let compressed = compressed_hint
            .unwrap_or(0)
            .max(gz.get_ref().map_or(0, |r| r.get_ref().bytes));
        let limit = inflate_limit(compressed);
        if data.len() as u64 > limit {
            return Err(bomb(name, limit, compressed));
        }
    }
    let format = match (detect(&data), &gzip_cut) {
        (Ok(format), _) => format,
        // Cut short before its format shows: the damage is the better explanation.
        (Err(_), Some(cut)) => {
            return Err(TraceError::Malformed {
                path: name.to_string(),
                index: 0,
                message: cut.clone(),
            })
        }
        (Err(what), None) => return Err(not_a_trace(format!("after gunzip, {what}"))),
    };
    Ok(Sniffed {
        data,
        format,
        gunzipped: true,
        gzip_cut,
    })
}

/// The inflated bytes of each gzip member of `inner` in turn, as `gzip -d` reads a file: zero
/// bytes after the last member are padding (a file written in whole blocks) and end the data;
/// other bytes there are an error holding [`TrailingData`], and bytes that start with the
/// gzip magic are the next member (a damaged one is an error as any other).
struct Members<R: std::io::BufRead> {
    state: MemberState<R>,
}

enum MemberState<R> {
    /// Inflating a member.
    Member(flate2::bufread::GzDecoder<R>),
    /// After the last member (and any padding).
    Done(R),
    /// Between the two, only while [`Members::read`] swaps them (or after it failed there).
    Between,
}

/// What follows the last gzip member when it is neither padding nor gzip.
#[derive(Debug)]
struct TrailingData {
    /// Its first bytes.
    first: Vec<u8>,
}

impl std::fmt::Display for TrailingData {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let hex: Vec<String> = self.first.iter().map(|b| format!("{b:02x}")).collect();
        write!(
            f,
            "data that is not gzip follows (first bytes {}; gzip -d ignores it as trailing garbage)",
            hex.join(" ")
        )
    }
}

impl std::error::Error for TrailingData {}

impl<R: std::io::BufRead> Members<R> {
    fn new(inner: R) -> Self {
        Members {
            state: MemberState::Member(flate2::bufread::GzDecoder::new(inner)),
        }
    }

    /// The compressed input (`None` only after a failed read between two members).
    fn get_ref(&self) -> Option<&R> {
        match &self.state {
            MemberState::Member(d) => Some(d.get_ref()),
            MemberState::Done(r) => Some(r),
            MemberState::Between => None,
        }
    }
}

impl<R: std::io::BufRead> Read for Members<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        loop {
            let MemberState::Member(d) = &mut self.state else {
                return Ok(0);
            };
            let n = d.read(buf)?;
            if n > 0 || buf.is_empty() {
                return Ok(n);
            }
            // The member ended: padding, another member, or trailing data.
            let MemberState::Member(d) = std::mem::replace(&mut self.state, MemberState::Between)
            else {
                return Ok(0);
            };
            let mut r = d.into_inner();
            loop {
                let avail = r.fill_buf()?;
                if avail.is_empty() {
                    self.state = MemberState::Done(r);
                    return Ok(0);
                }
                if avail[0] == GZIP_MAGIC[0] {
                    self.state = MemberState::Member(flate2::bufread::GzDecoder::new(r));
                    break;
                }
                match avail.iter().position(|&b| b != 0) {
                    Some(0) => {
                        let first = avail[..avail.len().min(8)].to_vec();
                        return Err(std::io::Error::new(
                            std::io::ErrorKind::InvalidData,
                            TrailingData { first },
                        ));
                    }
                    // Zeros, then something: skip the zeros and look again.
                    Some(at) => r.consume(at),
                    None => {
                        let n = avail.len();
                        r.consume(n);
                    }
                }
            }
        }
    }
}

/// A reader that counts the bytes read through it.
struct Counted<R> {
    inner: R,
    bytes: u64,
}

impl<R: Read> Read for Counted<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.bytes += n as u64;
        Ok(n)
    }
}

/// Detects the format of (already inflated) `bytes`.
///
/// # Errors
/// A description of what the bytes are instead of a trace (for [`TraceError::NotATrace`]).
pub fn detect(bytes: &[u8]) -> Result<Format, String> {
    detect_with(bytes, true)
}

/// [`detect`] on the first bytes of a file; `complete` says whether they are the whole file.
/// A text-protocol pickle is then recognised by its first byte alone, and white space or a
/// first line longer than the bytes given leaves the decision to the whole file.
///
/// # Errors
/// As [`detect`], only for what the first bytes already show.
pub fn detect_with(bytes: &[u8], complete: bool) -> Result<Format, String> {
    if !complete {
        if matches!(bytes.first(), Some(b'(' | b'}' | b']')) {
            return Ok(Format::TorchSnapshot);
        }
        let text = strip_bom(bytes);
        let blank = text.iter().all(|b| b.is_ascii_whitespace());
        let start = text.iter().position(|b| !b.is_ascii_whitespace());
        let open_line = start.is_some_and(|s| !text[s..].contains(&b'\n'));
        let binary = bytes[..bytes.len().min(512)]
            .iter()
            .any(|&b| b < 0x09 || (0x0e..0x20).contains(&b));
        if (blank || open_line) && !binary {
            // Undecided: let the whole file speak.
            return Ok(Format::JsonLines);
        }
    }
    if bytes.is_empty() {
        return Err("it is empty (0 bytes)".into());
    }
    if bytes[0] == PICKLE_PROTO {
        return match bytes.get(1) {
            Some(2..=5) => Ok(Format::TorchSnapshot),
            Some(p) => Err(format!(
                "looks like a pickle but announces protocol {p} (expected 2 to 5)"
            )),
            None => Err("a single 0x80 byte (a pickle cut after its first byte)".into()),
        };
    }
    if matches!(bytes[0], b'(' | b'}' | b']') && bytes.ends_with(b".") {
        return Ok(Format::TorchSnapshot);
    }
    for (magic, what) in [
        (
            &b"PK\x03\x04"[..],
            "a ZIP archive (a torch.save checkpoint?), not a memory snapshot",
        ),
        (
            &b"\x28\xb5\x2f\xfd"[..],
            "zstd-compressed data: decompress it first (zstd -d)",
        ),
        (
            &b"\xfd7zXZ\x00"[..],
            "xz-compressed data: decompress it first (xz -d)",
        ),
        (
            &b"BZh"[..],
            "bzip2-compressed data: decompress it first (bunzip2)",
        ),
    ] {
        if bytes.starts_with(magic) {
            return Err(what.into());
        }
    }
    if bytes.get(TAR_MAGIC_OFFSET..TAR_MAGIC_OFFSET + TAR_MAGIC.len()) == Some(TAR_MAGIC) {
        return Err("a tar archive: extract the trace first (tar -xf FILE)".into());
    }
    let text = strip_bom(bytes);
    let start = text
        .iter()
        .position(|b| !b.is_ascii_whitespace())
        .unwrap_or(text.len());
    let text = &text[start..];
    if text.is_empty() {
        return Err("the file holds only white space".into());
    }
    if text.starts_with(LFS_POINTER) {
        return Err(
            "a Git LFS pointer, not the file itself (run `git lfs pull` to fetch it)".into(),
        );
    }
    let first_line = first_line(text);
    let lower = String::from_utf8_lossy(&first_line[..first_line.len().min(64)]).to_lowercase();
    if lower.starts_with("<!doctype html")
        || lower.starts_with("<html")
        || lower.starts_with("<?xml")
    {
        return Err("an HTML/XML page (a failed download or a login page?)".into());
    }
    if is_rmm_header(first_line) {
        return Ok(Format::RmmCsv);
    }
    if text[0] == b'{' {
        return Ok(Format::JsonLines);
    }
    let sample = &bytes[..bytes.len().min(512)];
    let binary = sample
        .iter()
        .filter(|&&b| b < 0x09 || (0x0e..0x20).contains(&b))
        .count();
    if binary > 0 {
        Err(format!(
            "binary data that is neither gzip nor a pickle (first bytes {})",
            hex_prefix(bytes)
        ))
    } else {
        Err(format!(
            "text that is neither an RMM CSV log (header Thread,Time,Action,Pointer,Size,Stream) \
             nor JSON lines; first line: {:?}",
            String::from_utf8_lossy(&first_line[..first_line.len().min(80)])
        ))
    }
}

fn strip_bom(bytes: &[u8]) -> &[u8] {
    bytes.strip_prefix(b"\xef\xbb\xbf").unwrap_or(bytes)
}

fn first_line(text: &[u8]) -> &[u8] {
    let end = text.iter().position(|&b| b == b'\n').unwrap_or(text.len());
    let line = &text[..end];
    line.strip_suffix(b"\r").unwrap_or(line)
}

/// Whether a line is the RMM `logging_resource_adaptor` CSV header.
fn is_rmm_header(line: &[u8]) -> bool {
    let line = String::from_utf8_lossy(line);
    let cols: Vec<&str> = line.split(',').map(str::trim).collect();
    ["Thread", "Action", "Pointer", "Size"]
        .iter()
        .all(|want| cols.iter().any(|c| c.eq_ignore_ascii_case(want)))
}

fn hex_prefix(bytes: &[u8]) -> String {
    bytes
        .iter()
        .take(8)
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn detects_formats() {
        assert_eq!(detect(b"\x80\x04\x95."), Ok(Format::TorchSnapshot));
        assert_eq!(detect(b"(dp0\n."), Ok(Format::TorchSnapshot));
        assert_eq!(
            detect(b"Thread,Time,Action,Pointer,Size,Stream\n"),
            Ok(Format::RmmCsv)
        );
        assert_eq!(detect(b"\n{\"action\":\"alloc\"}\n"), Ok(Format::JsonLines));
    }

    #[test]
    fn names_what_is_not_a_trace() {
        let lfs = b"version https://git-lfs.github.com/spec/v1\noid sha256:abc\nsize 12\n";
        assert!(detect(lfs).unwrap_err().contains("Git LFS pointer"));
        assert!(detect(b"<!DOCTYPE html><html></html>")
            .unwrap_err()
            .contains("HTML"));
        assert!(detect(b"").unwrap_err().contains("empty"));
        assert!(detect(b"\x00\x01\x02\xff").unwrap_err().contains("binary"));
        assert!(detect(b"hello world\n")
            .unwrap_err()
            .contains("hello world"));
        assert!(detect(b"\x80\x09").unwrap_err().contains("protocol 9"));
        assert!(detect(b"PK\x03\x04\x14\x00").unwrap_err().contains("ZIP"));
        assert!(detect(b"\x28\xb5\x2f\xfd\x00")
            .unwrap_err()
            .contains("zstd -d"));
    }

    /// An endless source: `head`, then `fill` bytes forever (reading it all would never end).
    struct Endless {
        head: Vec<u8>,
        fill: u8,
        served: u64,
    }

    impl Read for Endless {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            let n = buf.len().min(1 << 16);
            for (i, b) in buf[..n].iter_mut().enumerate() {
                let at = self.served as usize + i;
                *b = self.head.get(at).copied().unwrap_or(self.fill);
            }
            self.served += n as u64;
            Ok(n)
        }
    }

    /// Issue 9 item 5: refused on the first bytes, never reading the whole input.
    #[test]
    fn refuses_on_the_first_bytes_of_endless_inputs() {
        let random = Endless {
            head: vec![0x6e, 0x71, 0x83, 0x55, 0x93, 0xb8, 0x39, 0xaa],
            fill: 0x01,
            served: 0,
        };
        let e = read_sniffed("random.bin", random, None, false).unwrap_err();
        assert!(e.to_string().contains("binary data"), "{e}");
        // An endless gzip stream of zeros (a decompression bomb) is refused after its first
        // inflated bytes.
        let zeros = Endless {
            head: Vec::new(),
            fill: 0,
            served: 0,
        };
        let gz = flate2::read::GzEncoder::new(zeros, flate2::Compression::fast());
        let e = read_sniffed("zeros.gz", gz, None, false).unwrap_err();
        let text = e.to_string();
        assert!(text.contains("after gunzip, binary data"), "{text}");
        assert!(text.contains("00 00 00 00"), "{text}");
        // Text that is neither format, on its first line.
        let text = Endless {
            head: b"hello world\n".to_vec(),
            fill: b'x',
            served: 0,
        };
        let e = read_sniffed("notes.txt", text, None, false).unwrap_err();
        assert!(e.to_string().contains("hello world"), "{e}");
    }

    #[test]
    fn the_inflate_limit_grows_with_the_compressed_size() {
        assert_eq!(inflate_limit(0), MIN_INFLATE_LIMIT_BYTES);
        assert_eq!(inflate_limit(1 << 20), MIN_INFLATE_LIMIT_BYTES);
        assert_eq!(inflate_limit(100 << 20), 100 * (100 << 20));
        assert_eq!(inflate_limit(u64::MAX), u64::MAX);
        // Past the limit, reading stops with a message that says why and how to read the
        // file anyway.
        let mut out = Vec::new();
        let err = read_limited("bomb.gz", &[0u8; 5000][..], &mut out, Some((1000, 10)))
            .unwrap_err()
            .to_string();
        assert!(out.len() <= 1001, "read {} bytes", out.len());
        assert!(err.contains("inflates past 1000 bytes"), "{err}");
        assert!(err.contains("decompression bomb"), "{err}");
        assert!(err.contains("gunzip -k"), "{err}");
    }

    fn gzip(data: &[u8]) -> Vec<u8> {
        use std::io::Write;
        let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        e.write_all(data).unwrap();
        e.finish().unwrap()
    }

    /// A gzip file padded with zeros (written in whole blocks), which `gzip -d` reads without
    /// a word, was refused as "gzip data truncated or corrupt ...: invalid gzip header"; other
    /// bytes after the data were called truncation too, though every byte had been inflated;
    /// a file compressed twice was "binary data that is neither gzip nor a pickle (first
    /// bytes 1f 8b ...)".
    #[test]
    fn what_follows_the_last_gzip_member_is_judged_as_gzip_does() {
        let text = b"{\"action\":\"alloc\",\"addr\":1,\"size\":8}\n".repeat(4000);
        let gz = gzip(&text);
        // Padding: read as if it were not there.
        let mut padded = gz.clone();
        padded.extend(std::iter::repeat_n(0u8, 3000));
        let s = read_sniffed("p.gz", &padded[..], None, false).unwrap();
        assert_eq!((s.data, s.gzip_cut), (text.clone(), None));
        // Two members, with padding between them, as gzip -d reads them.
        let mut two = gz.clone();
        two.extend([0u8; 10]);
        two.extend(gzip(b"{\"action\":\"free\",\"addr\":1}\n"));
        let s = read_sniffed("two.gz", &two[..], None, false).unwrap();
        assert!(s.data.starts_with(&text) && s.data.len() > text.len());
        // Other bytes after the data: refused, saying that all of it was inflated; a
        // lenient read keeps it all.
        let mut trailing = gz.clone();
        trailing.extend(b"\0\0garbage\n");
        let e = read_sniffed("t.gz", &trailing[..], None, false)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains(&format!(
                "the gzip data ends after {} inflated bytes, then data that is not gzip follows (first bytes 67 61 72",
                text.len()
            )),
            "{e}"
        );
        assert!(!e.contains("truncated"), "{e}");
        let s = read_sniffed("t.gz", &trailing[..], None, true).unwrap();
        assert_eq!(s.data, text);
        // Compressed twice.
        let e = read_sniffed("d.gz", &gzip(&gz)[..], None, false)
            .unwrap_err()
            .to_string();
        assert!(e.contains("compressed twice"), "{e}");
        // A member cut short is still damage.
        let e = read_sniffed("c.gz", &gz[..gz.len() - 20], None, false)
            .unwrap_err()
            .to_string();
        assert!(e.contains("gzip data truncated or corrupt after"), "{e}");
    }
}
