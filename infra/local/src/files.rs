//! The payload store of `sas-local --data DIR`: each payload a file under `DIR/payloads/`, its
//! object name ([`PayloadRef::key`], `tasks/<task id>/<sha256>.json`) the relative path, as
//! S3 keeps them in a stack's bucket.

use sas::domain::payload::MAX_PAYLOAD_BYTES;
use sas::domain::{PayloadRef, TaskId};
use sas::ports::{PayloadError, Payloads};
use std::io::{ErrorKind, Read, Write};
use std::path::{Path, PathBuf};

/// The folder under the data folder the payloads are kept in.
pub const PAYLOADS_DIR: &str = "payloads";

/// Payloads as files under a folder.
#[derive(Debug, Clone)]
pub struct FilePayloads {
    root: PathBuf,
}

impl FilePayloads {
    /// The payloads under `data_dir/payloads` (made when the first is written).
    pub fn under(data_dir: &Path) -> Self {
        Self {
            root: data_dir.join(PAYLOADS_DIR),
        }
    }

    /// Where the object named `key` is kept.
    pub fn path_of(&self, key: &str) -> PathBuf {
        self.root.join(key)
    }
}

fn unavailable(what: &Path, e: std::io::Error) -> PayloadError {
    PayloadError::Unavailable(format!("{}: {e}", what.display()))
}

/// Runs blocking file work off the async threads.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, PayloadError> + Send + 'static,
) -> Result<T, PayloadError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| PayloadError::Unavailable(format!("file payloads: {e}")))?
}

/// Writes `body` to `path` whole or not at all: into a new file beside it, flushed to disk,
/// then renamed over it, so that a reader (or a restart after a crash) never sees half an
/// object. Two writers of one name write the same bytes; the last rename wins.
fn write_whole(path: &Path, body: &[u8]) -> Result<(), PayloadError> {
    let dir = path
        .parent()
        .ok_or_else(|| PayloadError::Rejected(format!("{} has no folder", path.display())))?;
    std::fs::create_dir_all(dir).map_err(|e| unavailable(dir, e))?;
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let temp = dir.join(format!(".{name}.{}.tmp", uuid::Uuid::new_v4().simple()));
    let written = std::fs::File::create(&temp).and_then(|mut f| {
        f.write_all(body)?;
        f.sync_all()
    });
    if let Err(e) = written.and_then(|()| std::fs::rename(&temp, path)) {
        let _ = std::fs::remove_file(&temp);
        return Err(unavailable(path, e));
    }
    Ok(())
}

/// Reads `path`, at most [`MAX_PAYLOAD_BYTES`] (more: [`PayloadError::Corrupt`]).
fn read_bounded(path: &Path, key: &str) -> Result<Vec<u8>, PayloadError> {
    let file = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == ErrorKind::NotFound => {
            return Err(PayloadError::NotFound(key.to_owned()));
        }
        Err(e) => return Err(unavailable(path, e)),
    };
    let mut body = Vec::new();
    file.take(MAX_PAYLOAD_BYTES as u64 + 1)
        .read_to_end(&mut body)
        .map_err(|e| unavailable(path, e))?;
    if body.len() > MAX_PAYLOAD_BYTES {
        return Err(PayloadError::Corrupt(format!(
            "{key}: more than {MAX_PAYLOAD_BYTES} bytes"
        )));
    }
    Ok(body)
}

#[async_trait::async_trait]
impl Payloads for FilePayloads {
    async fn put(&self, task_id: TaskId, body: &[u8]) -> Result<PayloadRef, PayloadError> {
        let r = PayloadRef::of(task_id, body);
        let path = self.path_of(&r.key());
        let body = body.to_vec();
        blocking(move || write_whole(&path, &body)).await?;
        Ok(r)
    }

    async fn get(&self, r: &PayloadRef) -> Result<Vec<u8>, PayloadError> {
        let key = r.key();
        let path = self.path_of(&key);
        let read_key = key.clone();
        let body = blocking(move || read_bounded(&path, &read_key)).await?;
        if r.matches(&body) {
            Ok(body)
        } else {
            Err(PayloadError::Corrupt(key))
        }
    }

    async fn delete_task(&self, task_id: TaskId) -> Result<usize, PayloadError> {
        let dir = self.path_of(&PayloadRef::prefix(task_id));
        blocking(move || {
            let entries = match std::fs::read_dir(&dir) {
                Ok(entries) => entries,
                Err(e) if e.kind() == ErrorKind::NotFound => return Ok(0),
                Err(e) => return Err(unavailable(&dir, e)),
            };
            let mut deleted = 0;
            for entry in entries {
                let path = entry.map_err(|e| unavailable(&dir, e))?.path();
                // Objects only: a leftover temporary file (`.<name>.<id>.tmp`) of a write that
                // died before its rename is no payload, and goes with the folder.
                let object = path
                    .file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| !n.starts_with('.') && n.ends_with(".json"));
                match std::fs::remove_file(&path) {
                    Ok(()) if object => deleted += 1,
                    Ok(()) => {}
                    Err(e) if e.kind() == ErrorKind::NotFound => {}
                    Err(e) => return Err(unavailable(&path, e)),
                }
            }
            match std::fs::remove_dir(&dir) {
                Ok(()) => {}
                Err(e) if e.kind() == ErrorKind::NotFound => {}
                Err(e) => return Err(unavailable(&dir, e)),
            }
            Ok(deleted)
        })
        .await
    }

    async fn delete(&self, r: &PayloadRef) -> Result<(), PayloadError> {
        let path = self.path_of(&r.key());
        blocking(move || match std::fs::remove_file(&path) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == ErrorKind::NotFound => Ok(()),
            Err(e) => Err(unavailable(&path, e)),
        })
        .await
    }
}
