//! Reads of a file in a checkout after MR code ran there (the engine's lock file, the apply's
//! `.planbot.toml`): bounded, and never following what MR code could have put in its place.
//!
//! MR code can replace any file of its checkout with a symbolic link (to planbot's config, its
//! store), a FIFO that a process it left behind holds open (a plain `read` blocks until the
//! writer goes), a FIFO it streams zeros into, or a file of gigabytes. So [`read`]:
//!
//! - opens every directory below the checkout and the file itself with `O_NOFOLLOW` (`openat`
//!   step by step: a link anywhere on the way is refused, not followed), the file with
//!   `O_NONBLOCK` too, so that opening a FIFO does not wait for a writer;
//! - accepts a regular file only (`fstat` on the open descriptor: what is read is what was
//!   checked), of at most `max` bytes, and never reads more than `max + 1`;
//! - runs on a blocking thread, never on the async workers, and gives up at `deadline` (the
//!   job's own), whatever the file system does.

use nix::fcntl::{openat, OFlag};
use nix::sys::stat::Mode;
use std::io::Read;
use std::os::fd::OwnedFd;
use std::path::{Component, Path, PathBuf};
use std::time::Instant;

/// Why a file of the checkout was not read. The texts name the file relative to the checkout.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CheckoutFileError {
    #[error("`{0}` is a symbolic link, or a directory on its way is: planbot does not follow links in a checkout after the engine ran there")]
    Link(String),
    #[error(
        "`{path}` is {kind}, not a regular file: planbot reads only regular files of a checkout"
    )]
    NotRegular { path: String, kind: &'static str },
    #[error("`{path}` is {} or more: planbot reads at most {} of it", size_text(*size), size_text(*max))]
    TooLarge { path: String, size: u64, max: u64 },
    #[error("`{0}` could not be read before the job's deadline")]
    TimedOut(String),
    #[error("`{path}` must be a relative path inside the checkout")]
    BadPath { path: String },
    #[error("`{path}`: {error}")]
    Io { path: String, error: String },
}

/// `12 MiB`, `512 KiB`, `300 bytes`.
pub fn size_text(bytes: u64) -> String {
    crate::core::repo_config::byte_size(bytes)
}

/// The content of `rel` (relative to the trusted directory `checkout`), `None` when it does not
/// exist; see the module docs for what is refused.
pub async fn read(
    checkout: &Path,
    rel: &Path,
    max: u64,
    deadline: Instant,
) -> Result<Option<Vec<u8>>, CheckoutFileError> {
    let shown = rel.display().to_string();
    let (checkout, rel) = (checkout.to_path_buf(), rel.to_path_buf());
    let job = tokio::task::spawn_blocking(move || read_blocking(&checkout, &rel, max));
    match tokio::time::timeout_at(deadline.into(), job).await {
        Ok(Ok(result)) => result,
        Ok(Err(e)) => Err(CheckoutFileError::Io {
            path: shown,
            error: format!("the reading thread failed: {e}"),
        }),
        // The thread stays blocked on the file system; the job goes on without it.
        Err(_) => Err(CheckoutFileError::TimedOut(shown)),
    }
}

fn read_blocking(
    checkout: &Path,
    rel: &Path,
    max: u64,
) -> Result<Option<Vec<u8>>, CheckoutFileError> {
    let shown = rel.display().to_string();
    let io = |e: std::io::Error| CheckoutFileError::Io {
        path: shown.clone(),
        error: e.to_string(),
    };
    let parts: Vec<PathBuf> = rel
        .components()
        .map(|c| match c {
            Component::Normal(p) => Ok(PathBuf::from(p)),
            _ => Err(CheckoutFileError::BadPath {
                path: shown.clone(),
            }),
        })
        .collect::<Result<_, _>>()?;
    let Some((name, dirs)) = parts.split_last() else {
        return Err(CheckoutFileError::BadPath { path: shown });
    };
    let mut dir: OwnedFd = std::fs::File::open(checkout).map_err(io)?.into();
    let no_follow = OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    for d in dirs {
        dir = match openat(
            &dir,
            d.as_path(),
            no_follow | OFlag::O_DIRECTORY,
            Mode::empty(),
        ) {
            Ok(fd) => fd,
            Err(nix::errno::Errno::ENOENT) => return Ok(None),
            Err(nix::errno::Errno::ELOOP | nix::errno::Errno::ENOTDIR) => {
                return Err(CheckoutFileError::Link(shown))
            }
            Err(e) => return Err(io(e.into())),
        };
    }
    let flags = no_follow | OFlag::O_RDONLY | OFlag::O_NONBLOCK | OFlag::O_NOCTTY;
    let fd = match openat(&dir, name.as_path(), flags, Mode::empty()) {
        Ok(fd) => fd,
        Err(nix::errno::Errno::ENOENT) => return Ok(None),
        Err(nix::errno::Errno::ELOOP) => return Err(CheckoutFileError::Link(shown)),
        Err(e) => return Err(io(e.into())),
    };
    let file = std::fs::File::from(fd);
    let meta = file.metadata().map_err(io)?;
    if !meta.is_file() {
        return Err(CheckoutFileError::NotRegular {
            path: shown,
            kind: kind_of(&meta.file_type()),
        });
    }
    if meta.len() > max {
        return Err(CheckoutFileError::TooLarge {
            path: shown,
            size: meta.len(),
            max,
        });
    }
    let mut out = Vec::with_capacity(meta.len() as usize);
    file.take(max + 1).read_to_end(&mut out).map_err(io)?;
    if out.len() as u64 > max {
        // It grew after the check.
        return Err(CheckoutFileError::TooLarge {
            path: shown,
            size: out.len() as u64,
            max,
        });
    }
    Ok(Some(out))
}

fn kind_of(t: &std::fs::FileType) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    if t.is_dir() {
        "a directory"
    } else if t.is_fifo() {
        "a FIFO (named pipe)"
    } else if t.is_socket() {
        "a socket"
    } else if t.is_char_device() || t.is_block_device() {
        "a device"
    } else {
        "not a regular file"
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn soon() -> Instant {
        Instant::now() + Duration::from_secs(10)
    }

    #[tokio::test]
    async fn a_regular_file_is_read_and_a_missing_one_is_none() {
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(d.path().join("a/b")).unwrap();
        std::fs::write(d.path().join("a/b/f"), b"hello").unwrap();
        let got = read(d.path(), Path::new("a/b/f"), 5, soon()).await;
        assert_eq!(got, Ok(Some(b"hello".to_vec())));
        assert_eq!(
            read(d.path(), Path::new("a/b/none"), 5, soon()).await,
            Ok(None)
        );
        assert_eq!(
            read(d.path(), Path::new("a/x/none"), 5, soon()).await,
            Ok(None)
        );
        let err = read(d.path(), Path::new("a/b/f"), 4, soon())
            .await
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "`a/b/f` is 5 bytes or more: planbot reads at most 4 bytes of it"
        );
        for bad in ["../f", "/etc/passwd", "a/../a/b/f", ""] {
            assert!(
                matches!(
                    read(d.path(), Path::new(bad), 5, soon()).await,
                    Err(CheckoutFileError::BadPath { .. })
                ),
                "{bad}"
            );
        }
    }

    #[tokio::test]
    async fn links_anywhere_on_the_way_are_refused() {
        let d = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("secret"), b"s3cret").unwrap();
        std::fs::create_dir(d.path().join("root")).unwrap();
        std::os::unix::fs::symlink(outside.path().join("secret"), d.path().join("root/f")).unwrap();
        std::os::unix::fs::symlink(outside.path(), d.path().join("linked")).unwrap();
        for rel in ["root/f", "linked/secret"] {
            let err = read(d.path(), Path::new(rel), 100, soon())
                .await
                .unwrap_err();
            assert_eq!(err, CheckoutFileError::Link(rel.into()), "{rel}");
        }
    }

    #[tokio::test]
    async fn a_fifo_is_refused_without_waiting_for_a_writer() {
        let d = tempfile::tempdir().unwrap();
        nix::unistd::mkfifo(&d.path().join("lock"), Mode::S_IRWXU).unwrap();
        let err = read(d.path(), Path::new("lock"), 100, soon())
            .await
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "`lock` is a FIFO (named pipe), not a regular file: planbot reads only regular files of a checkout"
        );
    }

    #[test]
    fn sizes_read_well() {
        assert_eq!(size_text(32 * 1024 * 1024), "32 MiB");
        assert_eq!(size_text(1536 * 1024), "1.5 MiB");
        assert_eq!(size_text(4096), "4 KiB");
        assert_eq!(size_text(12), "12 bytes");
    }
}
