//! Files the commands write (`report -o`, `convert -o`, `replay --timeline`, `bench transfer
//! --plot`): checked before any work is done, never the input, and written last through a
//! temporary file beside the target that is then renamed, so a failed or interrupted run
//! leaves an existing file as it was. A symbolic link is followed (the file it names is
//! replaced, the link stays); a device, pipe or socket (`/dev/stdout`, `/dev/null`, a FIFO)
//! is written in place, since a file renamed over it would replace it.
use std::io::Write;
use std::path::Path;

use anyhow::{bail, Context, Result};

/// Whether `a` and `b` name the same existing file: the same device and inode (hard links
/// included) on Unix, the same canonical path elsewhere.
pub fn same_file(a: &Path, b: &Path) -> bool {
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        if let (Ok(x), Ok(y)) = (std::fs::metadata(a), std::fs::metadata(b)) {
            return x.dev() == y.dev() && x.ino() == y.ino();
        }
    }
    match (std::fs::canonicalize(a), std::fs::canonicalize(b)) {
        (Ok(x), Ok(y)) => x == y,
        _ => false,
    }
}

/// The folder a temporary file for `out` goes into (its parent, `.` for a bare name).
fn folder(out: &Path) -> &Path {
    out.parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."))
}

/// Checks, before any work, that `out` (given with `flag`, e.g. `-o`) can be written without
/// touching it: it is none of `inputs` (`-`, standard input, is skipped), not a folder, and
/// its folder takes a new file.
///
/// # Errors
/// One line naming the flag and the file, and what to do instead.
pub fn check(flag: &str, out: &Path, inputs: &[&Path]) -> Result<()> {
    if out.as_os_str().is_empty() {
        bail!("{flag} '': expected a file name");
    }
    let special = is_special(out);
    for input in inputs {
        if input.as_os_str() != "-" && same_file(input, out) {
            bail!(
                "{flag} {}: that is the input file; writing onto it would destroy it (choose another output)",
                out.display()
            );
        }
    }
    if out.is_dir() {
        bail!(
            "{flag} {}: that is a folder; expected a file name",
            out.display()
        );
    }
    // `x/` (or `x/..`) names a folder, which a file cannot be renamed onto.
    if names_a_folder(out) {
        bail!(
            "{flag} {}: a folder's name (it ends with /); expected a file name",
            out.display()
        );
    }
    if special {
        // Written in place: no temporary file beside it.
        return Ok(());
    }
    let target = resolved(out);
    let dir = folder(&target);
    if dir.exists() && !dir.is_dir() {
        bail!(
            "{flag} {}: {} is a file, not a folder",
            out.display(),
            dir.display()
        );
    }
    if !dir.is_dir() {
        bail!(
            "{flag} {}: the folder {} does not exist",
            out.display(),
            dir.display()
        );
    }
    tempfile::Builder::new()
        .prefix(".gpumem-")
        .tempfile_in(dir)
        .with_context(|| {
            format!(
                "{flag} {}: cannot write in {}",
                out.display(),
                dir.display()
            )
        })?;
    Ok(())
}

/// Whether `out` as written can only name a folder: it ends with a separator (`x/`) or
/// with no file name at all (`x/..`, `/`).
fn names_a_folder(out: &Path) -> bool {
    out.file_name().is_none() || out.as_os_str().to_string_lossy().ends_with('/')
}

/// Whether `out` exists (links followed) and is neither a file nor a folder: a device, a
/// pipe or a socket, which is written in place.
fn is_special(out: &Path) -> bool {
    std::fs::metadata(out).is_ok_and(|m| !m.is_file() && !m.is_dir())
}

/// The file a symbolic link `out` names (so that the link stays and its file is replaced);
/// `out` itself when it is no link, or a link that cannot be resolved (a dangling one is
/// then replaced, as before).
fn resolved(out: &Path) -> std::path::PathBuf {
    if out.is_symlink() {
        if let Ok(p) = std::fs::canonicalize(out) {
            return p;
        }
    }
    out.to_path_buf()
}

/// Writes `out` through a temporary file in its folder, renamed over `out` once `fill` has
/// written everything: on failure `out` is left as it was. A new file gets the usual mode
/// (0666 less the umask), an existing one keeps its own. A symbolic link is followed; a
/// device, pipe or socket is written in place (a failure there may leave part written).
///
/// # Errors
/// Creating, writing or renaming the file, each naming `out`.
pub fn write(out: &Path, fill: impl FnOnce(&mut std::fs::File) -> Result<()>) -> Result<()> {
    if is_special(out) {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .open(out)
            .with_context(|| format!("opening {}", out.display()))?;
        return fill(&mut f)
            .and_then(|()| Ok(f.flush()?))
            .with_context(|| format!("writing {}", out.display()));
    }
    let target = resolved(out);
    let out = target.as_path();
    let dir = folder(out);
    let mut builder = tempfile::Builder::new();
    builder.prefix(".gpumem-");
    #[cfg(unix)]
    let mode = {
        use std::os::unix::fs::PermissionsExt;
        std::fs::metadata(out)
            .map(|m| m.permissions())
            .unwrap_or_else(|_| std::fs::Permissions::from_mode(0o666))
    };
    #[cfg(unix)]
    builder.permissions(mode.clone());
    let mut tmp = builder
        .tempfile_in(dir)
        .with_context(|| format!("creating a temporary file in {}", dir.display()))?;
    fill(tmp.as_file_mut())
        .and_then(|()| Ok(tmp.as_file_mut().flush()?))
        .with_context(|| format!("writing {}", out.display()))?;
    // An existing file keeps its mode exactly (the umask applied at creation may differ).
    #[cfg(unix)]
    if out.exists() {
        let _ = tmp.as_file().set_permissions(mode);
    }
    // A failed rename hands the temporary file back inside its error: delete it here, as
    // the process may exit before that error is dropped.
    tmp.persist(out).map_err(|e| {
        let _ = e.file.close();
        anyhow::Error::new(e.error).context(format!("writing {}", out.display()))
    })?;
    Ok(())
}

/// [`write`] of a whole text.
///
/// # Errors
/// As [`write`].
pub fn write_text(out: &Path, text: &str) -> Result<()> {
    write(out, |f| Ok(f.write_all(text.as_bytes())?))
}

/// Refuses a picture's file name (`flag` names the option) that does not end in `.svg`: the
/// pictures are drawn as SVG, and `x.png` would hold SVG under a name that promises PNG.
///
/// # Errors
/// One line naming the flag, the file and the extension expected.
pub fn check_svg(flag: &str, path: &Path) -> Result<()> {
    match path.extension().and_then(|e| e.to_str()) {
        Some(e) if e.eq_ignore_ascii_case("svg") => Ok(()),
        Some(e) => bail!(
            "{flag} {}: the picture is drawn as SVG, not .{e}; name the file .svg (convert it afterwards if you need another format)",
            path.display()
        ),
        None => bail!(
            "{flag} {}: the picture is drawn as SVG; name the file .svg",
            path.display()
        ),
    }
}

/// Prints to standard error what the reader noticed: a salvaged truncation, skipped events
/// (the first five, then how many more) and warnings.
pub fn print_read_notes(trace: &gpumem::trace::Trace) {
    for n in trace.lenient_notes() {
        eprintln!("  {n}");
    }
    for w in &trace.warnings {
        eprintln!("  warning: {w}");
    }
}
