//! A `unix:` listener's regions and descriptors under a hostile local
//! client: one that connects and goes a thousand times, that never reads
//! its welcome, that sends descriptors of its own to the listener.

mod common;

use common::{unique_name, TempTable};
use livereg::wire::{Frame, VERSION};
use livereg::{Address, TableOptions};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

/// A Unix socket path no other test uses, removed on drop.
struct SocketPath(String);

impl SocketPath {
    fn new(tag: &str) -> SocketPath {
        SocketPath(format!("/tmp/{}.sock", unique_name(tag)))
    }
    fn address(&self) -> Address {
        Address::parse(&format!("unix:{}", self.0)).unwrap()
    }
}

impl Drop for SocketPath {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn short_timeout() -> TableOptions {
    TableOptions {
        capacity: 64,
        reap_timeout: Duration::from_secs(1),
        registration_grace: Duration::from_secs(3),
        ..TableOptions::default()
    }
}

/// A table of [`short_timeout`] named for `tag`, and its reaper serving
/// `unix:` sessions at a socket named for it too.
fn served(tag: &str) -> (TempTable, SocketPath, livereg::ReaperThread) {
    let temp = TempTable::new(tag, &short_timeout());
    let socket = SocketPath::new(tag);
    let reaper = temp
        .table
        .reaper()
        .listen(socket.address(), None)
        .spawn()
        .unwrap();
    (temp, socket, reaper)
}

fn hello(instance_id: u64) -> Vec<u8> {
    Frame::Hello {
        version: VERSION,
        instance_id,
        pid: std::process::id(),
        token: Vec::new(),
        label: "raw".into(),
        host: "here".into(),
        reclaim: None,
    }
    .encode()
}

/// The memfds named `livereg-session` open in this process (the listener's
/// regions: the listener runs here).
fn regions_open() -> usize {
    std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .filter_map(|entry| std::fs::read_link(entry.ok()?.path()).ok())
        .filter(|target| target.to_string_lossy().contains("livereg-session"))
        .count()
}

/// Descriptors open in this process.
fn descriptors_open() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

/// Held by each test that counts this process's descriptors: the others
/// open and close theirs meanwhile.
static COUNTING: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn counting() -> std::sync::MutexGuard<'static, ()> {
    COUNTING
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !done() {
        assert!(Instant::now() < deadline, "{what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Sends `bytes` on `socket` with `fds` attached (`SCM_RIGHTS`).
fn send_with_fds(socket: &UnixStream, bytes: &[u8], fds: &[i32]) -> std::io::Result<usize> {
    let mut iov = libc::iovec {
        iov_base: bytes.as_ptr() as *mut libc::c_void,
        iov_len: bytes.len(),
    };
    let mut control = vec![0u64; 64];
    let data_len = std::mem::size_of_val(fds) as u32;
    // SAFETY: CMSG_SPACE only computes a size.
    let space = unsafe { libc::CMSG_SPACE(data_len) } as usize;
    assert!(space <= control.len() * 8);
    // SAFETY: an all-zero msghdr is a valid empty one.
    let mut message: libc::msghdr = unsafe { std::mem::zeroed() };
    message.msg_iov = &mut iov;
    message.msg_iovlen = 1;
    message.msg_control = control.as_mut_ptr().cast();
    message.msg_controllen = space as _;
    // SAFETY: the control buffer holds `space` bytes, room for one header
    // and `fds`.
    unsafe {
        let header = libc::CMSG_FIRSTHDR(&message);
        (*header).cmsg_level = libc::SOL_SOCKET;
        (*header).cmsg_type = libc::SCM_RIGHTS;
        (*header).cmsg_len = libc::CMSG_LEN(data_len) as _;
        std::ptr::copy_nonoverlapping(
            fds.as_ptr(),
            libc::CMSG_DATA(header).cast::<i32>(),
            fds.len(),
        );
    }
    // SAFETY: `message` names live buffers for the call.
    let sent = unsafe { libc::sendmsg(socket.as_raw_fd(), &message, libc::MSG_NOSIGNAL) };
    if sent < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(sent as usize)
    }
}

#[test]
fn a_thousand_unix_sessions_come_and_go_and_the_listener_keeps_no_region() {
    let _counting = counting();
    let (temp, socket, reaper) = served("regions-churn");
    let before = descriptors_open();
    let (mut welcomed, mut most_regions) = (0, 0);
    for i in 0..1000u64 {
        let mut stream = UnixStream::connect(&socket.0).unwrap();
        std::io::Write::write_all(&mut stream, &hello(1000 + i)).unwrap();
        if i % 2 == 0 {
            // Waits for its welcome (and its region), then goes.
            let mut byte = [0u8; 1];
            assert_eq!(std::io::Read::read(&mut stream, &mut byte).unwrap(), 1);
            welcomed += 1;
            most_regions = most_regions.max(regions_open());
        }
        // (Every other one goes without reading: its region in flight.)
        drop(stream);
        if i % 50 == 49 {
            // At most a table's worth of regions at a time (the bound).
            wait_for("the sessions never ended", || {
                temp.table.status().unwrap().registrations.is_empty()
            });
        }
    }
    wait_for("the ended sessions' regions were kept", || {
        temp.table.status().unwrap().registrations.is_empty() && regions_open() == 0
    });
    assert_eq!(welcomed, 500);
    assert!(most_regions > 0, "no region was ever shared");
    let after = descriptors_open();
    assert!(
        after <= before + 8,
        "descriptors: {before} before a thousand sessions, {after} after"
    );
    reaper.stop().unwrap();
}

#[test]
fn descriptors_a_client_sends_the_listener_are_never_kept() {
    let _counting = counting();
    let (temp, socket, reaper) = served("regions-fds-in");
    let null = std::fs::File::open("/dev/null").unwrap();
    let before = descriptors_open();
    let fds = [null.as_raw_fd(); 32];
    for i in 0..50u64 {
        let stream = UnixStream::connect(&socket.0).unwrap();
        // Refused at the send (Linux 6.16 on), or sent and dropped unread:
        // either way nothing of it stays in the listener.
        if send_with_fds(&stream, &hello(2000 + i), &fds).is_ok() {
            let mut byte = [0u8; 1];
            let _ = std::io::Read::read(&mut &stream, &mut byte);
        }
    }
    wait_for("the sessions never ended", || {
        temp.table.status().unwrap().registrations.is_empty() && regions_open() == 0
    });
    let after = descriptors_open();
    assert!(
        after <= before + 8,
        "descriptors: {before} before, {after} after 1,600 sent to the listener"
    );
    reaper.stop().unwrap();
}

/// A TCP socket whose close blocks: its peer (`server`, kept open by the
/// caller, never read) has a full window, so the FIN waits behind the data,
/// and `SO_LINGER` makes whoever closes it last wait `linger` for it.
fn lingering_socket(linger: Duration) -> (std::net::TcpStream, std::net::TcpStream) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let client = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
    let (server, _) = listener.accept().unwrap();
    client.set_nonblocking(true).unwrap();
    let chunk = vec![7u8; 65536];
    let mut full = 0;
    while full < 50 {
        match std::io::Write::write(&mut &client, &chunk) {
            Ok(_) => full = 0,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                full += 1;
                std::thread::sleep(Duration::from_millis(2));
            }
            Err(e) => panic!("{e}"),
        }
    }
    set_linger(&client, Some(linger));
    (client, server)
}

/// `SO_LINGER` on `socket`: `Some(0)` resets it at its close.
fn set_linger(socket: &std::net::TcpStream, linger: Option<Duration>) {
    let option = libc::linger {
        l_onoff: i32::from(linger.is_some()),
        l_linger: linger.map_or(0, |l| l.as_secs() as i32),
    };
    // SAFETY: `option` is a valid linger for the call's length.
    let rc = unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            (&option as *const libc::linger).cast(),
            std::mem::size_of::<libc::linger>() as u32,
        )
    };
    assert_eq!(rc, 0);
}

/// How long a new session waits for its welcome.
fn welcome_takes(socket: &SocketPath, instance_id: u64) -> Duration {
    let started = Instant::now();
    let mut stream = UnixStream::connect(&socket.0).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(60)))
        .unwrap();
    std::io::Write::write_all(&mut stream, &hello(instance_id)).unwrap();
    let mut byte = [0u8; 1];
    assert_eq!(std::io::Read::read(&mut stream, &mut byte).unwrap(), 1);
    started.elapsed()
}

#[test]
fn a_descriptor_whose_close_blocks_sent_to_the_listener_never_freezes_it() {
    let _counting = counting();
    let (_temp, socket, reaper) = served("regions-linger");
    assert!(welcome_takes(&socket, 3000) < Duration::from_secs(5));
    let (lingering, _peer) = lingering_socket(Duration::from_secs(30));
    let stream = UnixStream::connect(&socket.0).unwrap();
    // Sent and let go by this process (the listener holds the last
    // reference), or refused at the send (then this process closes it
    // at once, without lingering).
    if send_with_fds(&stream, &hello(3001), &[lingering.as_raw_fd()]).is_err() {
        set_linger(&lingering, Some(Duration::ZERO));
    }
    drop(lingering);
    drop(stream);
    std::thread::sleep(Duration::from_millis(200));
    let took = welcome_takes(&socket, 3002);
    assert!(
        took < Duration::from_secs(10),
        "a new session waited {took:?} for its welcome"
    );
    reaper.stop().unwrap();
}

/// The welcome of a raw session on `stream`, and the region's memfd.
fn welcome_with_region(stream: &UnixStream) -> std::fs::File {
    let (welcome, region) = welcome_and_region(stream);
    assert!(
        matches!(welcome, Frame::Welcome { .. }),
        "expected a welcome, found {welcome:?}"
    );
    region.expect("a memfd with the welcome")
}

/// The welcome of a raw session on `stream` (or its refusal), and the
/// region's memfd if one came with it.
fn welcome_and_region(stream: &UnixStream) -> (Frame, Option<std::fs::File>) {
    let mut bytes = vec![0u8; 8192];
    let (mut have, mut region) = (0, None);
    loop {
        let mut iov = libc::iovec {
            iov_base: bytes[have..].as_mut_ptr().cast(),
            iov_len: bytes.len() - have,
        };
        let mut control = [0u64; 16];
        // SAFETY: an all-zero msghdr is a valid empty one.
        let mut message: libc::msghdr = unsafe { std::mem::zeroed() };
        message.msg_iov = &mut iov;
        message.msg_iovlen = 1;
        message.msg_control = control.as_mut_ptr().cast();
        message.msg_controllen = std::mem::size_of_val(&control) as _;
        // SAFETY: `message` names `bytes` and `control`, live for the call.
        let read = unsafe { libc::recvmsg(stream.as_raw_fd(), &mut message, 0) };
        assert!(read > 0, "recvmsg: {}", std::io::Error::last_os_error());
        have += read as usize;
        // SAFETY: the kernel filled the control bytes; an SCM_RIGHTS
        // header's data holds a descriptor now open in this process.
        unsafe {
            let header = libc::CMSG_FIRSTHDR(&message);
            if !header.is_null() && (*header).cmsg_type == libc::SCM_RIGHTS {
                let fd = std::ptr::read_unaligned(libc::CMSG_DATA(header).cast::<libc::c_int>());
                region = Some(<std::fs::File as std::os::fd::FromRawFd>::from_raw_fd(fd));
            }
        }
        match Frame::decode(&bytes[..have]).unwrap() {
            // (Or whatever else came first: a refusal.)
            Some((answer @ (Frame::Welcome { .. } | Frame::Refused { .. }), _)) => {
                return (answer, region)
            }
            Some((Frame::Info { .. }, used)) => {
                bytes.copy_within(used..have, 0);
                have -= used;
            }
            Some((other, _)) => panic!("expected a welcome, found {other:?}"),
            None => {}
        }
    }
}

#[test]
fn a_client_can_neither_resize_nor_reseal_its_region_and_punching_it_harms_nobody() {
    let _counting = counting();
    let (temp, socket, reaper) = served("regions-seals");
    let stream = UnixStream::connect(&socket.0).unwrap();
    std::io::Write::write_all(&mut &stream, &hello(4000)).unwrap();
    let region = welcome_with_region(&stream);
    let size = region.metadata().unwrap().len();
    assert!(region.set_len(0).is_err(), "shrunk");
    assert!(region.set_len(size * 2).is_err(), "grown");
    // SAFETY: fcntl on a descriptor this test owns; no memory is passed.
    let resealed =
        unsafe { libc::fcntl(region.as_raw_fd(), libc::F_ADD_SEALS, libc::F_SEAL_WRITE) };
    assert_eq!(resealed, -1, "a seal added");
    // Its pages given back under the listener's map, over and over: the
    // listener reads zeros (no fault), and serves on.
    let started = Instant::now();
    while started.elapsed() < Duration::from_millis(500) {
        // SAFETY: fallocate on a descriptor this test owns.
        let rc = unsafe {
            libc::fallocate(
                region.as_raw_fd(),
                libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                0,
                size as i64,
            )
        };
        assert_eq!(rc, 0, "{}", std::io::Error::last_os_error());
    }
    assert_eq!(region.metadata().unwrap().len(), size);
    assert!(welcome_takes(&socket, 4001) < Duration::from_secs(10));
    assert!(temp
        .table
        .status()
        .unwrap()
        .registrations
        .iter()
        .any(|r| r.instance_id == 4000));
    reaper.stop().unwrap();
}

/// Threads of this process.
fn threads() -> usize {
    std::fs::read_dir("/proc/self/task").unwrap().count()
}

/// Mappings of session regions in this process.
fn regions_mapped() -> usize {
    std::fs::read_to_string("/proc/self/maps")
        .unwrap()
        .lines()
        .filter(|line| line.contains("livereg-session"))
        .count()
}

#[test]
fn a_unix_client_that_comes_and_goes_a_hundred_times_keeps_no_thread_region_or_descriptor() {
    let _counting = counting();
    let (temp, socket, reaper) = served("regions-client-churn");
    let options = livereg::ConnectOptions::default();
    // One first: the threads a process keeps once it connected at all.
    livereg::connect(&socket.address().to_string(), 1, "w", &options)
        .unwrap()
        .deregister()
        .unwrap();
    wait_for("the first session's region was kept", || {
        temp.table.status().unwrap().registrations.is_empty() && regions_open() == 0
    });
    let (threads_before, descriptors_before) = (threads(), descriptors_open());
    for i in 0..100u64 {
        let worker = livereg::connect(&socket.address().to_string(), 2 + i, "w", &options).unwrap();
        worker.heartbeat().unwrap();
        worker.deregister().unwrap();
    }
    wait_for("threads, regions or descriptors were kept", || {
        temp.table.status().unwrap().registrations.is_empty()
            && regions_open() == 0
            && regions_mapped() == 0
            && threads() <= threads_before
            && descriptors_open() <= descriptors_before
    });
    reaper.stop().unwrap();
}

/// A raw client's map of its region, unmapped on drop.
struct Mapped {
    base: *mut u8,
    size: usize,
}

impl Mapped {
    fn of(region: &std::fs::File) -> Mapped {
        let size = region.metadata().unwrap().len() as usize;
        // SAFETY: a shared map of a file we hold, of its size.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                size,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                region.as_raw_fd(),
                0,
            )
        };
        assert_ne!(base, libc::MAP_FAILED);
        Mapped {
            base: base.cast(),
            size,
        }
    }

    /// Its process word 0 (the death word), at the offset
    /// docs/sessions.md gives: a page-rounded table of one slot, then the
    /// death words' 128-byte header.
    fn death_word(&self) -> &std::sync::atomic::AtomicU32 {
        // SAFETY: sysconf has no preconditions.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as usize;
        let offset = livereg::table_size(1).div_ceil(page) * page + 128;
        assert!(offset + 4 <= self.size);
        // SAFETY: inside the map (checked), 4-byte aligned; an atomic, as
        // the reaper reads it; lives as long as `self`.
        unsafe { &*self.base.add(offset).cast::<std::sync::atomic::AtomicU32>() }
    }
}

impl Drop for Mapped {
    fn drop(&mut self) {
        // SAFETY: the map made in `of`, unmapped once.
        unsafe { libc::munmap(self.base.cast(), self.size) };
    }
}

/// Reads `stream` until the peer closes it: whether an `Ended` frame came
/// first.
fn told_ended_before_close(mut stream: &UnixStream) -> bool {
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let mut bytes = Vec::new();
    // A reset after the frames is a close too.
    let _ = std::io::Read::read_to_end(&mut stream, &mut bytes);
    let mut rest = &bytes[..];
    while let Ok(Some((frame, used))) = Frame::decode(rest) {
        if matches!(frame, Frame::Ended { .. }) {
            return true;
        }
        rest = &rest[used..];
    }
    false
}

/// A region session's client whose registration ended (it never beat)
/// and whose slot went to a session beating with frames (protocol 3),
/// saying `last` before its listener told it its end: the second
/// session's row once the listener has read `last` and closed the first
/// connection, and whether it told the first client its end first (then
/// `last` may never have been read). `tag` names the table.
fn after_its_slot_went_to_another(
    tag: &str,
    last: &Frame,
) -> Vec<(bool, livereg::RegistrationStatus)> {
    // Two slots (a listener holds no more sessions than the table's
    // capacity, the first's connection among them until it is told): the
    // first free is taken, the very slot the first client had.
    let options = TableOptions {
        capacity: 2,
        ..short_timeout()
    };
    let temp = TempTable::new(tag, &options);
    let socket = SocketPath::new(tag);
    let reaper = temp
        .table
        .reaper()
        .listen(socket.address(), None)
        .spawn()
        .unwrap();
    let row = |instance: u64| {
        temp.table
            .status()
            .unwrap()
            .registrations
            .into_iter()
            .find(|r| r.instance_id == instance)
    };
    // `last` must be read after the slot went to the second session and
    // before the listener tells the first its end (at its next tick, up
    // to T/4 later): tried until it was, at most ten times.
    let mut seen = Vec::new();
    for attempt in 0..10u64 {
        let (first, second) = (5000 + 2 * attempt, 5001 + 2 * attempt);
        let stream = UnixStream::connect(&socket.0).unwrap();
        std::io::Write::write_all(&mut &stream, &hello(first)).unwrap();
        let region = Mapped::of(&welcome_with_region(&stream));
        // Its word held (a thread id, not marked), as its death thread
        // would hold it: its row says so.
        region
            .death_word()
            .store(4242, std::sync::atomic::Ordering::SeqCst);
        wait_for("the first client's death word in status", || {
            row(first).is_some_and(|r| r.death_word)
        });
        // It never beats: ended after its grace, its slot released.
        let deadline = Instant::now() + Duration::from_secs(30);
        while row(first).is_some() {
            assert!(Instant::now() < deadline, "never ended");
            std::thread::sleep(Duration::from_millis(1));
        }
        let other = UnixStream::connect(&socket.0).unwrap();
        let hello_3 = Frame::Hello {
            version: 3,
            instance_id: second,
            pid: std::process::id(),
            token: Vec::new(),
            label: "frames".into(),
            host: "here".into(),
            reclaim: None,
        };
        std::io::Write::write_all(&mut &other, &hello_3.encode_for(3)).unwrap();
        wait_for("the second session registered", || row(second).is_some());
        assert_eq!(row(second).unwrap().slot, 0, "the first client's slot");
        // (Refused if the listener closed it already: told its end.)
        let _ = std::io::Write::write_all(&mut &stream, &last.encode());
        let told = told_ended_before_close(&stream);
        seen.push((told, row(second).expect("the second session lives")));
        drop(other);
        wait_for("the second session ended", || row(second).is_none());
        if !told || seen.len() >= 3 {
            break;
        }
    }
    reaper.stop().unwrap();
    seen
}

#[test]
fn a_bye_after_the_slot_went_to_another_session_leaves_its_death_word_in_status_alone() {
    let _counting = counting();
    let seen = after_its_slot_went_to_another("regions-bye-reused", &Frame::Bye {});
    // A Bye read is a close without a word (its registration was over).
    let (_, second) = seen
        .iter()
        .find(|(told, _)| !told)
        .expect("the listener told the first client its end before its Bye every time");
    assert!(
        !second.death_word,
        "the first client's region spoke for the second session: {second:?}"
    );
}

#[test]
fn a_beat_frame_after_the_slot_went_to_another_session_leaves_its_count_alone() {
    let _counting = counting();
    let beat = Frame::Beat {
        heartbeats: 777,
        since_ping_us: 0,
        busy: false,
        steps: 0,
    };
    // Read or not (both end in `Ended`), the second session never beat:
    // no count but its own in its row, ever.
    for (_, second) in after_its_slot_went_to_another("regions-beat-reused", &beat) {
        assert_eq!(second.heartbeats, 0, "the first client's count: {second:?}");
        assert!(!second.death_word, "{second:?}");
    }
}

#[test]
fn a_session_whose_region_no_reaper_reads_any_more_shows_no_death_word() {
    let _counting = counting();
    let (temp, socket, reaper) = served("regions-restart-word");
    let row = |instance: u64| {
        temp.table
            .status()
            .unwrap()
            .registrations
            .into_iter()
            .find(|r| r.instance_id == instance)
    };
    let stream = UnixStream::connect(&socket.0).unwrap();
    std::io::Write::write_all(&mut &stream, &hello(6000)).unwrap();
    let (welcome, region) = welcome_and_region(&stream);
    let Frame::Welcome {
        slot,
        generation,
        secret,
        ..
    } = welcome
    else {
        panic!("expected a welcome, found {welcome:?}")
    };
    let region = Mapped::of(&region.expect("a region"));
    region
        .death_word()
        .store(4242, std::sync::atomic::Ordering::SeqCst);
    wait_for("the client's death word in status", || {
        row(6000).is_some_and(|r| r.death_word)
    });
    // Its reaper goes (the registration stays, for its client to take
    // back); the next one shares no region for it: nothing sees its death
    // as it begins any more, and its row must not say it does.
    reaper.stop().unwrap();
    let socket = SocketPath::new("regions-restart-word-2");
    let reaper = temp
        .table
        .reaper()
        .listen(socket.address(), None)
        .spawn()
        .unwrap();
    // Its client takes it back, and beats with frames.
    let stream = UnixStream::connect(&socket.0).unwrap();
    let reclaim = Frame::Hello {
        version: VERSION,
        instance_id: 6000,
        pid: std::process::id(),
        token: Vec::new(),
        label: "raw".into(),
        host: "here".into(),
        reclaim: Some(livereg::wire::Reclaim {
            slot,
            generation,
            secret,
        }),
    };
    std::io::Write::write_all(&mut &stream, &reclaim.encode()).unwrap();
    let (taken_back, region_again) = welcome_and_region(&stream);
    assert!(
        matches!(taken_back, Frame::Welcome { .. }),
        "expected a welcome, found {taken_back:?}"
    );
    assert!(region_again.is_none(), "a region to beat in");
    let deadline = Instant::now() + Duration::from_secs(30);
    for heartbeats in 1.. {
        let beat = Frame::Beat {
            heartbeats,
            since_ping_us: 0,
            busy: false,
            steps: 0,
        };
        std::io::Write::write_all(&mut &stream, &beat.encode()).unwrap();
        match row(6000) {
            None => panic!("taken back, beating, and ended"),
            Some(r) if !r.death_word => break,
            Some(_) => assert!(Instant::now() < deadline, "its death word still shown"),
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    drop(region);
    reaper.stop().unwrap();
}

#[test]
fn sessions_registering_while_resets_end_every_registration_keep_no_region() {
    let _counting = counting();
    let (temp, socket, reaper) = served("regions-reset-race");
    // Resets in a row: one may end a session's registration between its
    // registering and its region being shared.
    let stop = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|scope| {
        scope.spawn(|| {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let _ = temp.table.reset(Duration::ZERO);
                std::thread::sleep(Duration::from_micros(200));
            }
        });
        for instance in 0..300u64 {
            let stream = UnixStream::connect(&socket.0).unwrap();
            std::io::Write::write_all(&mut &stream, &hello(7000 + instance)).unwrap();
            drop(welcome_and_region(&stream));
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
    });
    wait_for("a region was kept past its registration's end", || {
        temp.table.status().unwrap().registrations.is_empty() && regions_open() == 0
    });
    reaper.stop().unwrap();
}

#[test]
fn a_client_that_beat_with_a_frame_is_judged_by_its_frames_whatever_its_region_says() {
    let _counting = counting();
    let (temp, socket, reaper) = served("regions-to-frames");
    let stream = UnixStream::connect(&socket.0).unwrap();
    std::io::Write::write_all(&mut &stream, &hello(8000)).unwrap();
    let region = Mapped::of(&welcome_with_region(&stream));
    // SAFETY: the beat count, 16 bytes into slot 0 (docs/sessions.md),
    // inside the map, 8-byte aligned; an atomic, as the reaper reads it.
    let beats = unsafe {
        &*region
            .base
            .add(livereg::HEADER_SIZE + 16)
            .cast::<std::sync::atomic::AtomicU64>()
    };
    let count = |until: Instant| {
        while Instant::now() < until {
            beats.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    // Counted in its region (no stamp of the reaper's clock: dated as the
    // reaper sees the count change), it lives on past its timeout.
    count(Instant::now() + Duration::from_secs(2));
    let row = temp.table.status().unwrap().registrations;
    assert!(
        row.iter()
            .any(|r| r.instance_id == 8000 && r.heartbeats > 0),
        "{row:?}"
    );
    // One beat frame: from now on its frames say when it beat, and its
    // region, counting on, says nothing.
    let beat = Frame::Beat {
        heartbeats: 1,
        since_ping_us: 0,
        busy: false,
        steps: 0,
    };
    std::io::Write::write_all(&mut &stream, &beat.encode()).unwrap();
    let silent = Instant::now();
    stream.set_nonblocking(true).unwrap();
    let (mut bytes, mut have) = ([0u8; 4096], 0);
    let ended = 'read: loop {
        count(Instant::now() + Duration::from_millis(20));
        match std::io::Read::read(&mut &stream, &mut bytes[have..]) {
            Ok(n) if n > 0 => have += n,
            Ok(_) => panic!("closed without a word"),
            Err(_) => {}
        }
        // (`Heard` frames said: a session beating with frames hears them.)
        while let Some((frame, used)) = Frame::decode(&bytes[..have]).unwrap() {
            if !matches!(frame, Frame::Heard {}) {
                break 'read frame;
            }
            bytes.copy_within(used..have, 0);
            have -= used;
        }
        assert!(
            silent.elapsed() < Duration::from_secs(10),
            "kept alive by its region"
        );
    };
    assert_eq!(
        ended,
        Frame::Ended {
            reason: livereg::Reason::Timeout
        }
    );
    assert!(
        silent.elapsed() >= Duration::from_millis(900),
        "{:?}",
        silent.elapsed()
    );
    drop(region);
    reaper.stop().unwrap();
}
