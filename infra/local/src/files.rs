//! The payload store of `sas-local --data DIR`: each payload a file under `DIR/payloads/`, its
//! object name ([`PayloadRef::key`], `tasks/<task id>/<sha256>.json`) the relative path, as
//! S3 keeps them in a stack's bucket. The objects users name (`s3://bucket/key`, a distributed
//! forEach's list) are files under `DIR/objects/<bucket>/<key>`, apart from the payloads.

use sas::domain::payload::{LinesWriter, MAX_PAYLOAD_BYTES};
use sas::domain::run::ObjectLocation;
use sas::domain::{PayloadRef, TaskId};
use sas::ports::{LineStream, PayloadError, Payloads};
use std::io::{ErrorKind, Read, Write};
use std::path::{Path, PathBuf};

/// The folder under the data folder the payloads are kept in.
pub const PAYLOADS_DIR: &str = "payloads";
/// The folder under the data folder the users' objects are kept in, a folder per bucket.
pub const OBJECTS_DIR: &str = "objects";

/// Payloads as files under a folder.
#[derive(Debug, Clone)]
pub struct FilePayloads {
    root: PathBuf,
    objects: PathBuf,
}

impl FilePayloads {
    /// The payloads under `data_dir/payloads` and the users' objects under `data_dir/objects`
    /// (each made when its first file is written).
    pub fn under(data_dir: &Path) -> Self {
        Self {
            root: data_dir.join(PAYLOADS_DIR),
            objects: data_dir.join(OBJECTS_DIR),
        }
    }

    /// Where the object named `key` is kept.
    pub fn path_of(&self, key: &str) -> PathBuf {
        self.root.join(key)
    }

    /// Where the user's object `s3://bucket/key` is kept: `objects/<bucket>/<key>`, each
    /// `/`-separated part of the key a folder or the file. A name that would not stay in its
    /// bucket's folder (an absolute key, a `..` or `.` part) or that two keys would share (an
    /// empty part: `a//b` is `a/b` on disk) is [`PayloadError::Rejected`].
    pub fn object_path(&self, bucket: &str, key: &str) -> Result<PathBuf, PayloadError> {
        let rejected = |why: &str| {
            PayloadError::Rejected(format!(
                "s3://{bucket}/{key}: {why}: no file of the local object store"
            ))
        };
        let mut path = self.objects.clone();
        if !plain_part(bucket) {
            return Err(rejected("the bucket's name is not a plain folder name"));
        }
        path.push(bucket);
        for part in key.split('/') {
            if !plain_part(part) {
                return Err(rejected("the key has an empty, `.` or `..` part"));
            }
            path.push(part);
        }
        Ok(path)
    }

    /// Places `bytes` as the user's object `s3://bucket/key` (a distributed forEach's list),
    /// replacing one there, whole or not at all: how a test or `sas-local` gives a run its
    /// list. Blocking file work, for setup.
    pub fn put_object(&self, bucket: &str, key: &str, bytes: Vec<u8>) -> Result<(), PayloadError> {
        write_whole(&self.object_path(bucket, key)?, &bytes)
    }
}

/// Whether `part` names one file or folder inside its parent, and no other part does: not
/// empty, not `.` or `..`, no separator, no NUL.
fn plain_part(part: &str) -> bool {
    !part.is_empty() && part != "." && part != ".." && !part.contains(['/', '\\', '\0'])
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
    let temp = temp_beside(path)?;
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

/// A new file's name beside `path` (its folder made if need be), unique to this write: where
/// an object is written before it is renamed over `path`.
fn temp_beside(path: &Path) -> Result<PathBuf, PayloadError> {
    let dir = path
        .parent()
        .ok_or_else(|| PayloadError::Rejected(format!("{} has no folder", path.display())))?;
    std::fs::create_dir_all(dir).map_err(|e| unavailable(dir, e))?;
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    Ok(dir.join(format!(".{name}.{}.tmp", uuid::Uuid::new_v4().simple())))
}

/// How much of a JSON Lines payload is held before it goes to its file.
const LINES_FLUSH_BYTES: usize = 1024 * 1024;

/// A JSON Lines payload being written: a new file beside its object, renamed over it once
/// every line is in it and flushed to disk (a reader never sees part of one; a write that
/// fails removes its file).
struct LinesFile {
    path: PathBuf,
    temp: PathBuf,
    file: Option<std::fs::File>,
}

impl LinesFile {
    async fn create(path: PathBuf) -> Result<Self, PayloadError> {
        blocking(move || {
            let temp = temp_beside(&path)?;
            let file = std::fs::File::create(&temp).map_err(|e| unavailable(&temp, e))?;
            Ok(Self {
                path,
                temp,
                file: Some(file),
            })
        })
        .await
    }

    /// Appends `bytes` (off the async threads).
    async fn append(&mut self, bytes: Vec<u8>) -> Result<(), PayloadError> {
        let (mut file, temp) = (self.file.take(), self.temp.clone());
        self.file = blocking(move || {
            if let Some(f) = file.as_mut() {
                f.write_all(&bytes).map_err(|e| unavailable(&temp, e))?;
            }
            Ok(file)
        })
        .await?;
        Ok(())
    }

    /// Flushed to disk and renamed over its object.
    async fn finish(mut self) -> Result<(), PayloadError> {
        let (file, temp, path) = (self.file.take(), self.temp.clone(), self.path.clone());
        blocking(move || {
            if let Some(f) = file {
                f.sync_all().map_err(|e| unavailable(&temp, e))?;
            }
            std::fs::rename(&temp, &path).map_err(|e| unavailable(&path, e))
        })
        .await
    }

    /// Removes the file of a write that failed.
    async fn discard(mut self) {
        self.file = None;
        let temp = self.temp.clone();
        let _ = blocking(move || {
            let _ = std::fs::remove_file(&temp);
            Ok(())
        })
        .await;
    }
}

/// Reads `path`, at most `max` bytes (more: [`PayloadError::Corrupt`]).
fn read_at_most(path: &Path, key: &str, max: usize) -> Result<Vec<u8>, PayloadError> {
    let file = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == ErrorKind::NotFound => {
            return Err(PayloadError::NotFound(format!("payload {key}")));
        }
        Err(e) => return Err(unavailable(path, e)),
    };
    let mut body = Vec::new();
    file.take(max as u64 + 1)
        .read_to_end(&mut body)
        .map_err(|e| unavailable(path, e))?;
    if body.len() > max {
        return Err(PayloadError::Corrupt(format!(
            "{key}: more than {max} bytes"
        )));
    }
    Ok(body)
}

/// Reads the user's object at `path` (in its bucket's folder `bucket_dir`), at most
/// `max_bytes`: over it, [`PayloadError::TooLarge`] on the file's length before it is read,
/// or on the bytes read if it grew meanwhile.
fn read_object_file(
    path: &Path,
    bucket_dir: &Path,
    location: &ObjectLocation,
    max_bytes: usize,
) -> Result<Vec<u8>, PayloadError> {
    let missing = || PayloadError::NotFound(format!("object {location}"));
    let too_large = || PayloadError::TooLarge {
        location: location.to_string(),
        max: max_bytes,
    };
    let file = match std::fs::File::open(path) {
        Ok(f) => f,
        // A part of the key is a file, not a folder: no object there either.
        Err(e) if matches!(e.kind(), ErrorKind::NotFound | ErrorKind::NotADirectory) => {
            return Err(if bucket_dir.is_dir() {
                missing()
            } else {
                PayloadError::NotFound(format!("bucket {} (of {location})", location.bucket))
            });
        }
        Err(e) => return Err(unavailable(path, e)),
    };
    let meta = file.metadata().map_err(|e| unavailable(path, e))?;
    // A folder is a prefix of other keys, not an object.
    if !meta.is_file() {
        return Err(missing());
    }
    if meta.len() > max_bytes as u64 {
        return Err(too_large());
    }
    let mut body = Vec::with_capacity(usize::try_from(meta.len()).unwrap_or(max_bytes));
    file.take(max_bytes as u64 + 1)
        .read_to_end(&mut body)
        .map_err(|e| unavailable(path, e))?;
    if body.len() > max_bytes {
        return Err(too_large());
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

    async fn put_lines(
        &self,
        task_id: TaskId,
        mut lines: LineStream<'_>,
    ) -> Result<PayloadRef, PayloadError> {
        use futures::TryStreamExt;
        let mut writer = LinesWriter::new(task_id);
        let key = writer.key();
        let mut file = LinesFile::create(self.path_of(&key)).await?;
        let mut written = async {
            let mut buffer = Vec::with_capacity(LINES_FLUSH_BYTES);
            while let Some(line) = lines.try_next().await? {
                writer
                    .push(&line, &mut buffer)
                    .map_err(|e| PayloadError::Rejected(format!("{key}: {e}")))?;
                if buffer.len() >= LINES_FLUSH_BYTES {
                    file.append(std::mem::take(&mut buffer)).await?;
                }
            }
            file.append(buffer).await
        }
        .await;
        if written.is_ok() {
            written = file.finish().await;
        } else {
            file.discard().await;
        }
        written.map(|()| writer.finish())
    }

    async fn get(&self, r: &PayloadRef) -> Result<Vec<u8>, PayloadError> {
        let key = r.key();
        let path = self.path_of(&key);
        let read_key = key.clone();
        // A JSON Lines payload has no bound but the disk's: its reference's length bounds it.
        let max = match &r.lines {
            Some(_) => usize::try_from(r.bytes).unwrap_or(usize::MAX),
            None => MAX_PAYLOAD_BYTES,
        };
        let body = blocking(move || read_at_most(&path, &read_key, max)).await?;
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
                let object = path.file_name().and_then(|n| n.to_str()).is_some_and(|n| {
                    !n.starts_with('.') && (n.ends_with(".json") || n.ends_with(".jsonl"))
                });
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

    async fn read_object(
        &self,
        location: &ObjectLocation,
        max_bytes: usize,
    ) -> Result<Vec<u8>, PayloadError> {
        let path = self.object_path(&location.bucket, &location.key)?;
        let bucket_dir = self.objects.join(&location.bucket);
        let location = location.clone();
        blocking(move || read_object_file(&path, &bucket_dir, &location, max_bytes)).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A key that would leave its bucket's folder (into the payloads, or anywhere) is refused,
    /// on a write and on a read, and nothing outside `objects/` is read or written.
    #[tokio::test]
    async fn a_key_that_escapes_its_bucket_is_rejected() {
        let dir = tempfile::tempdir().expect("a folder");
        let store = FilePayloads::under(dir.path());
        // A file a `..` key would reach: `objects/lists/../../payloads/secret.json`.
        let secret = dir.path().join(PAYLOADS_DIR).join("secret.json");
        write_whole(&secret, b"[\"secret\"]").expect("written");
        // The bucket's folder exists, so a `..` path would resolve if it were let through.
        store
            .put_object("lists", "list.json", b"[1]".to_vec())
            .expect("placed");
        for key in [
            "../../payloads/secret.json",
            "a/../../../payloads/secret.json",
            "..",
            "./list.json",
            "a//list.json",
            "/etc/passwd",
        ] {
            let location = ObjectLocation {
                bucket: "lists".into(),
                key: key.into(),
                lines: false,
            };
            let read = store.read_object(&location, 1024).await;
            assert!(
                matches!(&read, Err(PayloadError::Rejected(_))),
                "{key}: {read:?}"
            );
            let put = store.put_object("lists", key, b"[]".to_vec());
            assert!(
                matches!(&put, Err(PayloadError::Rejected(_))),
                "{key}: {put:?}"
            );
        }
        let placed: Vec<_> = std::fs::read_dir(dir.path().join(OBJECTS_DIR).join("lists"))
            .expect("the bucket's folder")
            .map(|e| e.expect("an entry").file_name())
            .collect();
        assert_eq!(placed, ["list.json"], "nothing else was written");
        assert_eq!(
            std::fs::read(&secret).expect("still there"),
            b"[\"secret\"]"
        );
        // A bucket's name is one folder too.
        let up = ObjectLocation {
            bucket: "..".into(),
            key: "payloads/secret.json".into(),
            lines: false,
        };
        assert!(matches!(
            store.read_object(&up, 1024).await,
            Err(PayloadError::Rejected(_))
        ));
    }
}
