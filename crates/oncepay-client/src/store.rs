//! Where intents live: their keys must survive a crash, so a process that
//! restarts mid-payment finishes it with the same key instead of paying
//! again with a new one.
//!
//! An intent is written once, durably, before its first request leaves
//! ([`IntentStore::insert_new`]), and once more when its final answer is
//! known (closed). [`FileStore`] makes each write crash-safe (write a
//! temporary file, fsync, then link or rename it into place, fsync the
//! folder); [`MemoryStore`] is for tests.

use std::collections::HashMap;
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};

/// Why the store failed.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// Reading or writing the store.
    #[error("{path}: {source}")]
    Io {
        /// The file or folder.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// A record that does not parse.
    #[error("{0}: not an intent record")]
    Corrupt(PathBuf),
}

/// Which command an intent sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Command {
    /// `POST /orders`.
    CreateOrder,
    /// `POST /payments`.
    Pay,
    /// `POST /payments/{id}/refunds`.
    Refund,
    /// `POST /orders/{id}/cancel`.
    Cancel,
    /// `POST /orders/{id}/checkout`.
    CreateCheckout,
    /// `POST /webhook_endpoints`.
    CreateWebhookEndpoint,
    /// `POST /customers/{customer_id}/balance/credits`.
    CreditBalance,
    /// `POST /customers/{customer_id}/balance/debits`.
    DebitBalance,
    /// `POST /customers/{customer_id}/balance/holds`.
    HoldBalance,
    /// `POST /balance_holds/{id}/capture`.
    CaptureHold,
    /// `POST /balance_holds/{id}/release`.
    ReleaseHold,
    /// `POST /payments` with `capture_method: manual`.
    PayManual,
    /// `POST /payments/{id}/capture`.
    Capture,
    /// `POST /payments/{id}/void`.
    Void,
}

/// The request an intent sends, every time, with its key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredRequest {
    /// Which command.
    pub command: Command,
    /// The path, e.g. `/payments`.
    pub path: String,
    /// The JSON body.
    pub body: Value,
}

/// The final answer of an intent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Closed {
    /// Unix seconds.
    pub at: u64,
    /// The HTTP status.
    pub status: u16,
    /// The body (a resource, or a problem).
    pub body: Value,
}

/// One business intent ("pay order 123") and its one idempotency key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IntentRecord {
    /// The caller's name for it.
    pub name: String,
    /// The idempotency key every send carries.
    pub key: String,
    /// Unix seconds.
    pub created_at: u64,
    /// What it sends.
    pub request: StoredRequest,
    /// Set once the final answer is known.
    pub closed: Option<Closed>,
}

/// Seconds since the epoch.
pub fn now_unix() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// Where intents are kept. Implementations must make `insert_new` atomic
/// (of two concurrent inserts of one name, one wins and both get the
/// winner) and durable before it returns.
pub trait IntentStore: Send + Sync {
    /// The intent called `name`, if any.
    fn load(&self, name: &str) -> Result<Option<IntentRecord>, StoreError>;
    /// Stores `record` unless an intent of that name exists; returns the
    /// one stored (the caller's, or the earlier one).
    fn insert_new(&self, record: IntentRecord) -> Result<IntentRecord, StoreError>;
    /// Replaces a stored intent (to close it).
    fn update(&self, record: &IntentRecord) -> Result<(), StoreError>;
    /// Every stored intent.
    fn list(&self) -> Result<Vec<IntentRecord>, StoreError>;
    /// Forgets an intent.
    fn remove(&self, name: &str) -> Result<(), StoreError>;

    /// The intents without a final answer: what a restarted process resumes.
    fn open(&self) -> Result<Vec<IntentRecord>, StoreError> {
        Ok(self
            .list()?
            .into_iter()
            .filter(|r| r.closed.is_none())
            .collect())
    }

    /// Forgets intents closed more than `older_than` ago (the service's key
    /// TTL, 24 h by default: past it a repeat would execute anew anyway).
    /// Returns how many.
    fn prune(&self, older_than: Duration) -> Result<usize, StoreError> {
        let cutoff = now_unix().saturating_sub(older_than.as_secs());
        let mut pruned = 0;
        for record in self.list()? {
            if record.closed.as_ref().is_some_and(|c| c.at < cutoff) {
                self.remove(&record.name)?;
                pruned += 1;
            }
        }
        Ok(pruned)
    }
}

/// Intents in memory, for tests and for processes that accept losing them.
///
/// ```
/// use oncepay_client::{IntentStore, MemoryStore};
/// let store = MemoryStore::default();
/// assert!(store.open().expect("memory").is_empty());
/// ```
#[derive(Debug, Default)]
pub struct MemoryStore {
    records: Mutex<HashMap<String, IntentRecord>>,
}

impl MemoryStore {
    fn records(&self) -> std::sync::MutexGuard<'_, HashMap<String, IntentRecord>> {
        self.records.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl IntentStore for MemoryStore {
    fn load(&self, name: &str) -> Result<Option<IntentRecord>, StoreError> {
        Ok(self.records().get(name).cloned())
    }

    fn insert_new(&self, record: IntentRecord) -> Result<IntentRecord, StoreError> {
        Ok(self
            .records()
            .entry(record.name.clone())
            .or_insert(record)
            .clone())
    }

    fn update(&self, record: &IntentRecord) -> Result<(), StoreError> {
        self.records().insert(record.name.clone(), record.clone());
        Ok(())
    }

    fn list(&self) -> Result<Vec<IntentRecord>, StoreError> {
        Ok(self.records().values().cloned().collect())
    }

    fn remove(&self, name: &str) -> Result<(), StoreError> {
        self.records().remove(name);
        Ok(())
    }
}

/// Intents as files in a folder, one JSON file each (named by a hash of
/// the intent's name), written crash-safely.
///
/// ```no_run
/// use oncepay_client::{FileStore, IntentStore};
/// let store = FileStore::open("/var/lib/shop/oncepay-intents")?;
/// for intent in store.open()? {
///     println!("open: {} ({})", intent.name, intent.key);
/// }
/// # Ok::<(), oncepay_client::StoreError>(())
/// ```
#[derive(Debug)]
pub struct FileStore {
    dir: PathBuf,
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> StoreError + '_ {
    move |source| StoreError::Io {
        path: path.to_path_buf(),
        source,
    }
}

impl FileStore {
    /// Opens (creating if needed) the folder `dir`.
    pub fn open(dir: impl Into<PathBuf>) -> Result<FileStore, StoreError> {
        let dir = dir.into();
        fs::create_dir_all(&dir).map_err(io(&dir))?;
        Ok(FileStore { dir })
    }

    fn path_of(&self, name: &str) -> PathBuf {
        let hash = Sha256::digest(name.as_bytes());
        let hex: String = hash[..16].iter().map(|b| format!("{b:02x}")).collect();
        self.dir.join(format!("{hex}.json"))
    }

    /// Writes `record` to a new temporary file and fsyncs it.
    fn write_temp(&self, record: &IntentRecord) -> Result<PathBuf, StoreError> {
        let tmp = self
            .dir
            .join(format!(".tmp-{}-{}", std::process::id(), fastrand::u64(..)));
        let bytes =
            serde_json::to_vec_pretty(record).map_err(|_| StoreError::Corrupt(tmp.clone()))?;
        let mut file = fs::File::create(&tmp).map_err(io(&tmp))?;
        file.write_all(&bytes).map_err(io(&tmp))?;
        file.sync_all().map_err(io(&tmp))?;
        Ok(tmp)
    }

    /// Makes the folder's new entry durable too.
    fn sync_dir(&self) -> Result<(), StoreError> {
        fs::File::open(&self.dir)
            .and_then(|d| d.sync_all())
            .map_err(io(&self.dir))
    }

    fn read(path: &Path) -> Result<Option<IntentRecord>, StoreError> {
        match fs::read(path) {
            Ok(bytes) => serde_json::from_slice(&bytes)
                .map(Some)
                .map_err(|_| StoreError::Corrupt(path.to_path_buf())),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(io(path)(e)),
        }
    }
}

impl IntentStore for FileStore {
    fn load(&self, name: &str) -> Result<Option<IntentRecord>, StoreError> {
        FileStore::read(&self.path_of(name))
    }

    fn insert_new(&self, record: IntentRecord) -> Result<IntentRecord, StoreError> {
        let path = self.path_of(&record.name);
        let tmp = self.write_temp(&record)?;
        // A hard link fails if the name exists: of concurrent inserts (in
        // any process), exactly one wins, and the file appears whole.
        let linked = fs::hard_link(&tmp, &path);
        let _ = fs::remove_file(&tmp);
        match linked {
            Ok(()) => {
                self.sync_dir()?;
                Ok(record)
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                FileStore::read(&path)?.ok_or(StoreError::Corrupt(path))
            }
            Err(e) => Err(io(&path)(e)),
        }
    }

    fn update(&self, record: &IntentRecord) -> Result<(), StoreError> {
        let path = self.path_of(&record.name);
        let tmp = self.write_temp(record)?;
        fs::rename(&tmp, &path).map_err(io(&path))?;
        self.sync_dir()
    }

    fn list(&self) -> Result<Vec<IntentRecord>, StoreError> {
        let mut out = Vec::new();
        for entry in fs::read_dir(&self.dir).map_err(io(&self.dir))? {
            let path = entry.map_err(io(&self.dir))?.path();
            if path.extension().is_some_and(|e| e == "json") {
                if let Some(record) = FileStore::read(&path)? {
                    out.push(record);
                }
            }
        }
        Ok(out)
    }

    fn remove(&self, name: &str) -> Result<(), StoreError> {
        let path = self.path_of(name);
        match fs::remove_file(&path) {
            Ok(()) => self.sync_dir(),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(io(&path)(e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(name: &str, key: &str) -> IntentRecord {
        IntentRecord {
            name: name.into(),
            key: key.into(),
            created_at: now_unix(),
            request: StoredRequest {
                command: Command::Pay,
                path: "/payments".into(),
                body: serde_json::json!({"order_id": "x"}),
            },
            closed: None,
        }
    }

    fn exercise(store: &dyn IntentStore) {
        assert!(store.load("pay 1").expect("load").is_none());
        let first = store.insert_new(record("pay 1", "k1")).expect("insert");
        assert_eq!(first.key, "k1");
        // A second insert of the same name gets the first one back.
        let again = store.insert_new(record("pay 1", "k2")).expect("insert");
        assert_eq!(again.key, "k1");
        assert_eq!(store.open().expect("open").len(), 1);
        let mut closed = first.clone();
        closed.closed = Some(Closed {
            at: now_unix() - 100_000,
            status: 201,
            body: serde_json::json!({}),
        });
        store.update(&closed).expect("update");
        assert!(store.open().expect("open").is_empty());
        assert_eq!(store.load("pay 1").expect("load"), Some(closed));
        store.insert_new(record("pay 2", "k3")).expect("insert");
        assert_eq!(store.prune(Duration::from_secs(86_400)).expect("prune"), 1);
        assert!(store.load("pay 1").expect("load").is_none());
        assert!(
            store.load("pay 2").expect("load").is_some(),
            "open intents are kept"
        );
    }

    #[test]
    fn memory_store_keeps_one_key_per_intent() {
        exercise(&MemoryStore::default());
    }

    #[test]
    fn file_store_keeps_one_key_per_intent_and_survives_reopening() {
        let dir = std::env::temp_dir().join(format!("oncepay-intents-{}", fastrand::u64(..)));
        let store = FileStore::open(&dir).expect("open");
        exercise(&store);
        // A new process (a new handle) finds what the old one wrote.
        let reopened = FileStore::open(&dir).expect("reopen");
        assert_eq!(reopened.open().expect("open").len(), 1);
        assert!(fs::read_dir(&dir).expect("dir").all(|e| !e
            .expect("entry")
            .file_name()
            .to_string_lossy()
            .starts_with(".tmp")));
        let _ = fs::remove_dir_all(&dir);
    }

    #[test]
    fn concurrent_inserts_of_one_intent_agree_on_one_key() {
        let dir = std::env::temp_dir().join(format!("oncepay-intents-{}", fastrand::u64(..)));
        let store = std::sync::Arc::new(FileStore::open(&dir).expect("open"));
        let keys: Vec<String> = (0..16)
            .map(|i| {
                let store = store.clone();
                std::thread::spawn(move || {
                    store
                        .insert_new(record("same", &format!("key-{i}")))
                        .expect("insert")
                        .key
                })
            })
            .collect::<Vec<_>>()
            .into_iter()
            .map(|t| t.join().expect("thread"))
            .collect();
        assert!(keys.iter().all(|k| *k == keys[0]), "{keys:?}");
        let _ = fs::remove_dir_all(&dir);
    }
}
