//! Following the fleet: every host's live registrations as a snapshot,
//! then each change as it happens (`livereg status --cluster --watch`).
//!
//! One etcd watch on the prefix, read on a thread of its own (so a slow
//! etcd never has its answers cut short by a consumer's short wait). When
//! the watch breaks (a member restarted, a leader change, the network) it
//! resumes from the revision after the last one read, so no event is lost
//! or told twice; when etcd has compacted that history away, the prefix is
//! listed again and compared with the view ([`super::view`]). A watch quiet
//! for a while asks etcd for its progress, so a member that hangs is left
//! too. Reconnects back off as the publisher's do, jittered.

use super::backoff::Backoff;
use super::error::EtcdError;
use super::options::EtcdOptions;
use super::record::{self, ClusterRecord};
use super::view::{ClusterChange, ClusterEvent, FleetView, KeyEvent};
use etcd_client::{Client, EventType, GetOptions, WatchOptions, WatchResponse, WatchStream};
use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long connecting, listing, opening the watch or a progress answer
/// may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// After this long without a message the watch asks etcd for its progress:
/// a member that hangs (stopped, partitioned, its disk stuck) says nothing
/// at all, and is left for another within `QUIET + REQUEST_TIMEOUT`.
const QUIET: Duration = Duration::from_secs(5);

/// Changes read but not yet taken by [`ClusterWatch::next`]; past this the
/// watch thread waits for the consumer (etcd keeps the history meanwhile,
/// or the watch lists again).
const UNTAKEN: usize = 16_384;

/// A consumer's view of the fleet, kept current from etcd.
///
/// ```no_run
/// use livereg::etcd::{ClusterEvent, ClusterWatch, EtcdOptions};
/// use std::time::Duration;
///
/// let mut fleet = ClusterWatch::start(&EtcdOptions::new(["10.0.0.5:2379"]))?;
/// for record in fleet.live() {
///     println!("live: {}/{}/{}", record.host, record.table, record.instance_id);
/// }
/// loop {
///     match fleet.next(Duration::from_secs(1)) {
///         Ok(Some(change)) => match change.event {
///             ClusterEvent::Registered { record } => println!("route to {}", record.instance_id),
///             ClusterEvent::Ended { record } => println!("drop {} ({:?})", record.instance_id, record.ended),
///             ClusterEvent::HostGone { host, .. } => println!("drop every engine of {host}"),
///         },
///         Ok(None) => {}                       // a second without news
///         Err(error) => eprintln!("{error}"), // etcd away: it retries by itself
///     }
/// }
/// # Ok::<(), livereg::etcd::EtcdError>(())
/// ```
pub struct ClusterWatch {
    prefix: String,
    /// The live records as of the last change taken, by key.
    live: BTreeMap<String, ClusterRecord>,
    revision: i64,
    news: mpsc::Receiver<News>,
    shared: Arc<Shared>,
    stop: Arc<tokio::sync::Notify>,
    thread: Option<JoinHandle<()>>,
}

/// What the watch thread tells the consumer.
enum News {
    Change(ClusterChange),
    Trouble(EtcdError),
}

/// What the watch thread and its handle share.
#[derive(Default)]
struct Shared {
    connected: AtomicBool,
    resumed: AtomicU64,
    relisted: AtomicU64,
}

/// The watch's state, driven on its thread.
struct Follower {
    options: EtcdOptions,
    view: FleetView,
    client: Option<Client>,
    stream: Option<WatchStream>,
    ready: VecDeque<ClusterChange>,
    backoff: Backoff,
    /// No attempt to reconnect before this.
    retry_at: Option<Instant>,
    /// Whether a watch was opened before (the next one resumes).
    opened: bool,
    shared: Arc<Shared>,
}

/// How often the watch had to recover.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct WatchCounts {
    /// Watches opened after the first (each resumed from the revision after
    /// the last one read).
    pub resumed: u64,
    /// Listings after the first, because etcd had compacted the history a
    /// resumed watch needed.
    pub relisted: u64,
}

impl ClusterWatch {
    /// Reads every live registration under `options.prefix` (the snapshot,
    /// [`ClusterWatch::live`]) and starts following changes from there, on
    /// a thread of its own. The options' host and TTL are not used.
    ///
    /// # Errors
    ///
    /// [`EtcdError::InvalidOptions`] for an empty endpoint list or endpoints
    /// that disagree with the TLS setting; [`EtcdError::Etcd`] or
    /// [`EtcdError::Timeout`] if etcd cannot be read now;
    /// [`EtcdError::Io`] if the thread cannot start.
    pub fn start(options: &EtcdOptions) -> Result<ClusterWatch, EtcdError> {
        super::options::check_endpoints(&options.endpoints, options.tls.is_some())?;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let shared = Arc::new(Shared::default());
        let mut follower = Follower {
            options: options.clone(),
            view: FleetView::new(&options.prefix),
            client: None,
            stream: None,
            ready: VecDeque::new(),
            backoff: Backoff::new(),
            retry_at: None,
            opened: false,
            shared: shared.clone(),
        };
        let listed = runtime.block_on(async {
            tokio::time::timeout(REQUEST_TIMEOUT, follower.list())
                .await
                .unwrap_or_else(|_| Err(follower.timeout("list the prefix")))
        });
        listed?;
        // The snapshot is the view itself, not news.
        follower.ready.clear();
        let prefix = record::trim_prefix(&options.prefix).to_owned();
        let live = follower
            .view
            .live()
            .map(|r| (key_of(&prefix, r), r.clone()))
            .collect();
        let revision = follower.view.revision();
        let (sender, news) = mpsc::sync_channel(UNTAKEN);
        let stop = Arc::new(tokio::sync::Notify::new());
        let stopped = stop.clone();
        let thread = std::thread::Builder::new()
            .name("livereg-etcd-watch".into())
            .spawn(move || runtime.block_on(follower.run(sender, stopped)))?;
        Ok(ClusterWatch {
            prefix,
            live,
            revision,
            news,
            shared,
            stop,
            thread: Some(thread),
        })
    }

    /// The live registrations as of [`ClusterWatch::revision`], by key:
    /// the snapshot, then as changed by each change [`ClusterWatch::next`]
    /// returned.
    pub fn live(&self) -> impl Iterator<Item = &ClusterRecord> {
        self.live.values()
    }

    /// The etcd revision of the last change taken (or of the snapshot).
    pub fn revision(&self) -> i64 {
        self.revision
    }

    /// Whether a watch is open now (false while etcd is away).
    pub fn is_connected(&self) -> bool {
        self.shared.connected.load(Ordering::Relaxed)
    }

    /// How often the watch resumed and re-listed since it started.
    pub fn counts(&self) -> WatchCounts {
        WatchCounts {
            resumed: self.shared.resumed.load(Ordering::Relaxed),
            relisted: self.shared.relisted.load(Ordering::Relaxed),
        }
    }

    /// The next change, waiting up to `timeout` for one; `Ok(None)` if none
    /// came. Changes come in revision order, each once.
    ///
    /// # Errors
    ///
    /// [`EtcdError::Etcd`], [`EtcdError::Timeout`] or
    /// [`EtcdError::WatchBroke`] when the watch broke or could not be opened
    /// again. Such an error is not final: the watch tries again by itself
    /// (backing off, at most a few times a second) from where it stopped.
    pub fn next(&mut self, timeout: Duration) -> Result<Option<ClusterChange>, EtcdError> {
        match self.news.recv_timeout(timeout) {
            Ok(News::Change(change)) => {
                self.take_in(&change);
                Ok(Some(change))
            }
            Ok(News::Trouble(error)) => Err(error),
            Err(mpsc::RecvTimeoutError::Timeout) => Ok(None),
            Err(mpsc::RecvTimeoutError::Disconnected) => Err(EtcdError::WatchBroke {
                endpoints: String::new(),
                why: "the watch thread ended".into(),
            }),
        }
    }

    /// Brings [`ClusterWatch::live`] up to `change`.
    fn take_in(&mut self, change: &ClusterChange) {
        self.revision = self.revision.max(change.revision);
        match &change.event {
            ClusterEvent::Registered { record } | ClusterEvent::Dying { record } => {
                self.live
                    .insert(key_of(&self.prefix, record), record.clone());
            }
            ClusterEvent::Ended { record } => {
                self.live.remove(&key_of(&self.prefix, record));
            }
            ClusterEvent::HostGone { records, .. } => {
                for record in records {
                    self.live.remove(&key_of(&self.prefix, record));
                }
            }
        }
    }
}

impl Drop for ClusterWatch {
    fn drop(&mut self) {
        self.stop.notify_one();
        // A thread blocked handing over a change is freed by the receiver
        // going; take it first.
        let (_, unused) = mpsc::sync_channel(1);
        drop(std::mem::replace(&mut self.news, unused));
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// A record's key under `prefix`.
fn key_of(prefix: &str, record: &ClusterRecord) -> String {
    record::key(prefix, &record.host, &record.table, record.instance_id)
}

impl Follower {
    /// Reads and hands over changes (and troubles) until told to stop or
    /// the consumer is gone.
    async fn run(mut self, news: mpsc::SyncSender<News>, stop: Arc<tokio::sync::Notify>) {
        loop {
            let read = tokio::select! {
                () = stop.notified() => return,
                read = self.read() => read,
            };
            self.shared
                .connected
                .store(self.stream.is_some(), Ordering::Relaxed);
            let troubles = read.err().map(News::Trouble);
            let changes = self.ready.drain(..).map(News::Change);
            for one in troubles.into_iter().chain(changes) {
                if news.send(one).is_err() {
                    return;
                }
            }
        }
    }

    /// Reads the next batch of changes into `ready` (perhaps none: a watch
    /// created, a progress note), reopening the watch first if it is
    /// closed (after the backoff's wait).
    async fn read(&mut self) -> Result<(), EtcdError> {
        if self.stream.is_none() {
            if let Some(at) = self.retry_at {
                tokio::time::sleep_until(at.into()).await;
            }
            let opened = tokio::time::timeout(REQUEST_TIMEOUT, self.open()).await;
            match opened.unwrap_or_else(|_| Err(self.timeout("open the watch"))) {
                Ok(()) => self.retry_at = None,
                Err(error) => return Err(self.failed(error)),
            }
        }
        let stream = self.stream.as_mut().expect("a watch is open");
        let message = match tokio::time::timeout(QUIET, stream.message()).await {
            Ok(message) => message,
            // A quiet fleet, or a member that hangs: ask it.
            Err(_) => match stream.request_progress().await {
                Err(error) => return Err(self.failed(self.etcd_error("ask for progress", error))),
                Ok(()) => match tokio::time::timeout(REQUEST_TIMEOUT, stream.message()).await {
                    Ok(message) => message,
                    Err(_) => {
                        let why = format!(
                            "no answer to a progress request within {REQUEST_TIMEOUT:?} (the member hangs)"
                        );
                        return Err(self.failed(self.broke(why)));
                    }
                },
            },
        };
        match message {
            Ok(Some(answer)) => self.heed(answer).await,
            Ok(None) => Err(self.failed(self.broke("the watch stream ended".into()))),
            Err(error) => Err(self.failed(self.etcd_error("watch", error))),
        }
    }

    /// Opens a watch from the revision after the view's (connecting first).
    async fn open(&mut self) -> Result<(), EtcdError> {
        let watch = WatchOptions::new()
            .with_prefix()
            .with_prev_key()
            .with_progress_notify()
            .with_start_revision(self.view.revision() + 1);
        let under = self.under();
        let client = self.connected().await?;
        let stream = client.watch(under, Some(watch)).await;
        self.stream = Some(stream.map_err(|e| self.etcd_error("open the watch", e))?);
        self.shared
            .resumed
            .fetch_add(u64::from(self.opened), Ordering::Relaxed);
        self.opened = true;
        Ok(())
    }

    /// The client, connecting first if there is none.
    async fn connected(&mut self) -> Result<&mut Client, EtcdError> {
        if self.client.is_none() {
            let client = super::connection::connect(&self.options, REQUEST_TIMEOUT)
                .await
                .map_err(|e| self.etcd_error("connect", e))?;
            self.client = Some(client);
        }
        Ok(self.client.as_mut().expect("connected"))
    }

    /// Folds one watch answer in; a compaction past the view means
    /// listing again.
    async fn heed(&mut self, answer: WatchResponse) -> Result<(), EtcdError> {
        if answer.compact_revision() > 0 {
            self.stream = None;
            self.shared.relisted.fetch_add(1, Ordering::Relaxed);
            log::info!(
                "etcd compacted its history to revision {} past this watch's {}: listing {} again",
                answer.compact_revision(),
                self.view.revision(),
                self.under()
            );
            return match tokio::time::timeout(REQUEST_TIMEOUT, self.list()).await {
                Ok(Ok(())) => Ok(()),
                Ok(Err(error)) => Err(self.failed(error)),
                Err(_) => Err(self.failed(self.timeout("list the prefix"))),
            };
        }
        if answer.canceled() {
            let why = format!("etcd canceled the watch: {}", answer.cancel_reason());
            return Err(self.failed(self.broke(why)));
        }
        self.backoff.succeeded();
        let events: Vec<KeyEvent<'_>> = answer
            .events()
            .iter()
            .filter_map(|event| {
                let kv = event.kv()?;
                Some(match event.event_type() {
                    EventType::Put => KeyEvent::Put {
                        key: kv.key(),
                        value: kv.value(),
                        revision: kv.mod_revision(),
                    },
                    EventType::Delete => KeyEvent::Delete {
                        key: kv.key(),
                        revision: kv.mod_revision(),
                    },
                })
            })
            .collect();
        if events.is_empty() {
            if !answer.created() {
                if let Some(header) = answer.header() {
                    self.view.caught_up(header.revision());
                }
            }
            return Ok(());
        }
        let changes = self.view.apply(&events);
        self.ready.extend(changes);
        Ok(())
    }

    /// Lists the prefix and takes what changed since the view into `ready`.
    async fn list(&mut self) -> Result<(), EtcdError> {
        let under = self.under();
        let client = self.connected().await?;
        let listing = client
            .get(under.as_str(), Some(GetOptions::new().with_prefix()))
            .await
            .map_err(|e| self.etcd_error(&format!("read {under}"), e))?;
        let revision = listing.header().map_or(0, |h| h.revision());
        let changes = self.view.relist(
            listing.kvs().iter().map(|kv| (kv.key(), kv.value())),
            revision,
        );
        self.ready.extend(changes);
        Ok(())
    }

    /// Gives the connection up and sets when to try again.
    fn failed(&mut self, error: EtcdError) -> EtcdError {
        self.stream = None;
        self.client = None;
        self.retry_at = Some(Instant::now() + self.backoff.failed());
        error
    }

    /// `<prefix>/`: every key the watch follows.
    fn under(&self) -> String {
        format!("{}/", record::trim_prefix(&self.options.prefix))
    }

    fn etcd_error(&self, context: &str, source: etcd_client::Error) -> EtcdError {
        EtcdError::Etcd {
            endpoints: self.options.endpoint_list(),
            context: context.to_owned(),
            source,
        }
    }

    fn broke(&self, why: String) -> EtcdError {
        EtcdError::WatchBroke {
            endpoints: self.options.endpoint_list(),
            why,
        }
    }

    fn timeout(&self, context: &str) -> EtcdError {
        EtcdError::Timeout {
            endpoints: self.options.endpoint_list(),
            context: context.to_owned(),
            timeout: REQUEST_TIMEOUT,
        }
    }
}
