//! Files the commands write (`report -o`, `convert -o`, `replay --timeline`, `bench transfer
//! --plot`): checked before any work is done, never the input, and written last through a
//! temporary file beside the target that is then renamed, so a failed or interrupted run
//! leaves an existing file as it was.
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
    let dir = folder(out);
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

/// Writes `out` through a temporary file in its folder, renamed over `out` once `fill` has
/// written everything: on failure `out` is left as it was. A new file gets the usual mode
/// (0666 less the umask), an existing one keeps its own.
///
/// # Errors
/// Creating, writing or renaming the file, each naming `out`.
pub fn write(out: &Path, fill: impl FnOnce(&mut std::fs::File) -> Result<()>) -> Result<()> {
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
    tmp.persist(out)
        .with_context(|| format!("writing {}", out.display()))?;
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
