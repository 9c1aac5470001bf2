//! Files a process owns, removed by the reaper once it has ended: across
//! real processes (`livereg worker --own`, `livereg run --own`) killed with
//! SIGKILL, exiting, forking and exec'ing; never while the maker lives,
//! never the wrong file (a file replaced or a link planted after the
//! declaration, a path outside the allowed directories, another user's
//! file), within the per-process limit; by the next reaper when none ran,
//! or when one died part way.

#[path = "../../tests/common/mod.rs"]
mod common;

#[path = "../../tests/common/owned_forgery.rs"]
mod owned_forgery;

#[path = "support/other_user.rs"]
mod other_user;

#[path = "support/worker_process.rs"]
mod worker_process;

use common::{long_options, unique_name, TempTable};
use livereg::{Error, Reaper, Table};
use owned_forgery::{file_at, file_record, forge, owner_at, owner_record};
use std::os::unix::fs::{MetadataExt, PermissionsExt};

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};
use worker_process::WorkerProcess;

/// A file in /dev/shm with a name no other test uses, removed on drop
/// (whatever a test left there: a file, a link).
struct ShmFile(PathBuf);

impl ShmFile {
    /// Made, with `bytes` bytes written.
    fn new(tag: &str, bytes: usize) -> ShmFile {
        let file = ShmFile::named(tag);
        std::fs::write(&file.0, vec![7u8; bytes]).unwrap();
        file
    }

    /// Not made.
    fn named(tag: &str) -> ShmFile {
        ShmFile(Path::new("/dev/shm").join(unique_name(&format!("owned-{tag}"))))
    }

    fn text(&self) -> &str {
        self.0.to_str().unwrap()
    }

    fn exists(&self) -> bool {
        self.0.symlink_metadata().is_ok()
    }
}

impl Drop for ShmFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// A `livereg worker` owning `files`, its declarations made.
fn owner(table: &str, instance: u64, files: &[&ShmFile], extra: &[&str]) -> WorkerProcess {
    let mut args: Vec<&str> = files.iter().flat_map(|f| ["--own", f.text()]).collect();
    args.extend(extra);
    let mut worker = WorkerProcess::worker(table, instance, &args);
    for file in files {
        worker.wait_for(&format!("owned {}", file.text()));
    }
    worker
}

/// What `table` says of the files processes own in it.
fn owned_in(table: &Table) -> livereg::OwnedFilesStatus {
    table
        .status()
        .unwrap()
        .owned_files
        .expect("a table with owned-file records")
}

/// Scans until no process owns files any more; returns every path
/// removed (the reaper's thread hands each over before it frees its
/// owner's record, so one more scan takes the last).
fn scan_until_settled(reaper: &mut Reaper, table: &Table) -> Vec<PathBuf> {
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut removed = Vec::new();
    loop {
        removed.extend(reaper.scan().unwrap().removed_files);
        let owned = owned_in(table);
        if owned.owners.is_empty() {
            removed.extend(reaper.scan().unwrap().removed_files);
            return removed;
        }
        assert!(Instant::now() < deadline, "still owned: {owned:?}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// A reaper's rounds settle without removing anything: `file` is left in
/// place, and the one refusal counted.
fn left_in_place_and_counted(temp: &TempTable, file: &Path) {
    let mut reaper = temp.table.reaper().build().unwrap();
    assert!(scan_until_settled(&mut reaper, &temp.table).is_empty());
    assert!(file.exists(), "{} removed", file.display());
    assert_eq!(owned_in(&temp.table).refused_total, 1);
}

/// Scans a few times while the owner lives: nothing is removed.
fn nothing_removed_while_it_lives(reaper: &mut Reaper, files: &[&ShmFile]) {
    for _ in 0..5 {
        assert!(reaper.scan().unwrap().removed_files.is_empty());
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(
        files.iter().all(|f| f.exists()),
        "removed while its maker lives"
    );
}

#[test]
fn a_killed_owner_s_files_are_removed_once_it_has_ended_and_never_before() {
    let temp = TempTable::new("owned-kill", &long_options());
    let (ring, sem) = (ShmFile::new("ring", 8192), ShmFile::new("sem", 32));
    let mut reaper = temp.table.reaper().build().unwrap();
    let worker = owner(&temp.name, 1, &[&ring, &sem], &[]);
    let owned = owned_in(&temp.table);
    assert_eq!(owned.owners.len(), 1);
    assert_eq!((owned.owners[0].files, owned.owners[0].bytes), (2, 8224));
    assert_eq!(owned.dirs, vec![PathBuf::from("/dev/shm")]);
    nothing_removed_while_it_lives(&mut reaper, &[&ring, &sem]);
    worker.signal(libc::SIGKILL);
    let mut removed = scan_until_settled(&mut reaper, &temp.table);
    removed.sort();
    let mut expected = vec![ring.0.clone(), sem.0.clone()];
    expected.sort();
    assert_eq!(removed, expected);
    assert!(!ring.exists() && !sem.exists());
    let owned = owned_in(&temp.table);
    assert_eq!((owned.removed_total, owned.refused_total), (2, 0));
    assert!(owned.freed_bytes_total >= 8192, "{owned:?}");
}

#[test]
fn a_file_replaced_after_its_declaration_is_left_alone() {
    let temp = TempTable::new("owned-replaced", &long_options());
    let file = ShmFile::new("replaced", 64);
    let mut reaper = temp.table.reaper().build().unwrap();
    let worker = owner(&temp.name, 2, &[&file], &[]);
    // Another file under the same name: another inode.
    let stand_in = file.0.with_extension("new");
    std::fs::write(&stand_in, b"someone else's").unwrap();
    std::fs::rename(&stand_in, &file.0).unwrap();
    worker.signal(libc::SIGKILL);
    assert!(scan_until_settled(&mut reaper, &temp.table).is_empty());
    assert_eq!(std::fs::read(&file.0).unwrap(), b"someone else's");
    let owned = owned_in(&temp.table);
    assert_eq!((owned.removed_total, owned.refused_total), (0, 1));
}

#[test]
fn a_link_planted_in_its_place_is_left_alone_and_its_target_untouched() {
    let temp = TempTable::new("owned-link", &long_options());
    let (file, target) = (ShmFile::new("link", 64), ShmFile::new("target", 64));
    let mut reaper = temp.table.reaper().build().unwrap();
    let worker = owner(&temp.name, 3, &[&file], &[]);
    std::fs::remove_file(&file.0).unwrap();
    std::os::unix::fs::symlink(&target.0, &file.0).unwrap();
    worker.signal(libc::SIGKILL);
    assert!(scan_until_settled(&mut reaper, &temp.table).is_empty());
    assert!(file.0.symlink_metadata().unwrap().file_type().is_symlink());
    assert!(target.exists());
    let owned = owned_in(&temp.table);
    assert_eq!(owned.refused_total, 1);
}

#[test]
fn declarations_outside_the_rules_are_refused_naming_the_path_and_the_rule() {
    let temp = TempTable::new("owned-refused", &long_options());
    let outside = std::env::temp_dir().join(unique_name("owned-outside"));
    std::fs::write(&outside, b"x").unwrap();
    let refused = temp.table.own_file(&outside);
    let _ = std::fs::remove_file(&outside);
    let message = match refused {
        Err(Error::InvalidArgument(message)) => message,
        other => panic!("expected InvalidArgument, got {other:?}"),
    };
    assert!(
        message.contains(outside.to_str().unwrap()) && message.contains("allowed directory"),
        "{message}"
    );
    // Not directly in the directory.
    let dir = ShmFile::named("dir");
    std::fs::create_dir(&dir.0).unwrap();
    let nested = dir.0.join("ring");
    std::fs::write(&nested, b"x").unwrap();
    assert!(matches!(
        temp.table.own_file(&nested),
        Err(Error::InvalidArgument(_))
    ));
    std::fs::remove_file(&nested).unwrap();
    std::fs::remove_dir(&dir.0).unwrap();
    // A link, never followed.
    let (link, target) = (ShmFile::named("a-link"), ShmFile::new("its-target", 8));
    std::os::unix::fs::symlink(&target.0, &link.0).unwrap();
    match temp.table.own_file(&link.0) {
        Err(Error::InvalidArgument(message)) => assert!(message.contains("regular file")),
        other => panic!("expected InvalidArgument, got {other:?}"),
    }
    // Nothing there.
    let missing = ShmFile::named("missing");
    assert!(matches!(
        temp.table.own_file(&missing.0),
        Err(Error::NotFound(_))
    ));
    // A name longer than NAME_MAX.
    let long = format!("/dev/shm/{}", "n".repeat(256));
    assert!(matches!(
        temp.table.own_file(&long),
        Err(Error::InvalidArgument(_))
    ));
    let owned = owned_in(&temp.table);
    assert!(owned.owners.iter().all(|o| o.files == 0));
}

#[test]
fn a_process_may_not_own_another_user_s_file() {
    // A table others may write, and a worker of another user (uid 12345).
    let options = livereg::TableOptions {
        mode: 0o666,
        ..long_options()
    };
    let temp = TempTable::new("owned-user", &options);
    let theirs = ShmFile::new("theirs", 8);
    std::os::unix::fs::chown(&theirs.0, Some(54_321), None).unwrap();
    let as_user = |file: &ShmFile, instance: &str| {
        let out = other_user::livereg_as(12_345)
            .args([
                "worker",
                &temp.name,
                "--instance",
                instance,
                "--own",
                file.text(),
            ])
            .output()
            .unwrap();
        assert!(!out.status.success());
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let message = as_user(&theirs, "10");
    assert!(
        message.contains("uid 54321") && message.contains(theirs.text()),
        "{message}"
    );
    assert!(theirs.exists());
    // Its own file too, on a table of root's that others may write: no
    // writer of the table may make the reaper remove another user's file.
    let own = ShmFile::new("own", 8);
    std::os::unix::fs::chown(&own.0, Some(12_345), None).unwrap();
    let message = as_user(&own, "11");
    assert!(message.contains("table's owner"), "{message}");
}

#[test]
fn a_table_whose_creator_allowed_no_directory_refuses_every_declaration() {
    let options = livereg::TableOptions {
        owned_dirs: Vec::new(),
        ..long_options()
    };
    let temp = TempTable::new("owned-none", &options);
    let file = ShmFile::new("none", 8);
    match temp.table.own_file(&file.0) {
        Err(Error::InvalidArgument(message)) => assert!(message.contains("allowed none")),
        other => panic!("expected InvalidArgument, got {other:?}"),
    }
}

/// A directory with a name no other test uses, removed on drop: in
/// `/dev/shm` (a tmpfs) or on disk (the build's temporary directory).
struct TestDir(PathBuf);

impl TestDir {
    fn in_dir(parent: &Path, tag: &str, mode: u32) -> TestDir {
        let dir = TestDir(parent.join(unique_name(&format!("owned-{tag}"))));
        std::fs::create_dir(&dir.0).unwrap();
        std::fs::set_permissions(&dir.0, std::fs::Permissions::from_mode(mode)).unwrap();
        dir
    }
}

impl Drop for TestDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// `statfs(path).f_type`.
fn file_system_type(path: &Path) -> u64 {
    let path = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: an all-zero `statfs` is a valid value to be written over;
    // `path` is NUL-terminated; both outlive the call.
    let mut fs: libc::statfs = unsafe { std::mem::zeroed() };
    assert_eq!(unsafe { libc::statfs(path.as_ptr(), &mut fs) }, 0);
    fs.f_type as u64
}

/// Cargo's temporary directory for tests, on the build's disk, by its real
/// path: a file is owned only by a path without links, and `target` may
/// be one (CI keeps the build in a private directory through one).
fn disk_dir() -> PathBuf {
    std::fs::canonicalize(env!("CARGO_TARGET_TMPDIR")).unwrap()
}

#[test]
fn on_a_disk_a_later_file_given_the_same_inode_number_is_never_removed() {
    let dir = TestDir::in_dir(&disk_dir(), "disk", 0o755);
    assert_ne!(
        file_system_type(&dir.0),
        libc::TMPFS_MAGIC as u64,
        "this test needs a disk file system, which reuses inode numbers"
    );
    let options = livereg::TableOptions {
        owned_dirs: vec![dir.0.clone()],
        ..long_options()
    };
    let temp = TempTable::new("owned-reuse", &options);
    let path = dir.0.join("segment");
    std::fs::write(&path, b"the maker's").unwrap();
    let text = path.to_str().unwrap();
    let mut maker = WorkerProcess::worker(&temp.name, 21, &["--own", text]);
    maker.wait_for(&format!("owned {text}"));
    // The maker's file removed (as its maker would), and another live
    // process's made under the name: the disk gives it the same number.
    let declared = std::fs::metadata(&path).unwrap().ino();
    let reused = (0..50).any(|_| {
        std::fs::remove_file(&path).unwrap();
        std::fs::write(&path, b"a live process's").unwrap();
        std::fs::metadata(&path).unwrap().ino() == declared
    });
    assert!(reused, "the file system never gave inode {declared} again");
    let mut reaper = temp.table.reaper().build().unwrap();
    maker.signal(libc::SIGKILL);
    assert!(scan_until_settled(&mut reaper, &temp.table).is_empty());
    assert_eq!(std::fs::read(&path).unwrap(), b"a live process's");
    assert_eq!(owned_in(&temp.table).refused_total, 1);
}

#[test]
fn a_file_system_that_keeps_no_birth_time_and_is_no_tmpfs_is_refused_at_declaration() {
    // A ramfs (no birth time, not a tmpfs), mounted in a mount namespace of
    // the declarer's own over an allowed directory.
    let dir = TestDir::in_dir(&disk_dir(), "ramfs", 0o755);
    let options = livereg::TableOptions {
        owned_dirs: vec![dir.0.clone()],
        ..long_options()
    };
    let temp = TempTable::new("owned-ramfs", &options);
    let script = format!(
        "mount -t ramfs ramfs {dir} && echo x > {dir}/segment && exec {livereg} worker {table} --instance 23 --own {dir}/segment",
        dir = dir.0.display(),
        livereg = env!("CARGO_BIN_EXE_livereg"),
        table = temp.name
    );
    let out = Command::new("unshare")
        .args(["--mount", "--propagation", "private", "sh", "-c", &script])
        .output()
        .unwrap();
    let message = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{message}");
    assert!(
        message.contains("keeps no birth time and reuses inode numbers")
            && message.contains("0x858458f6"),
        "{message}"
    );
}

#[test]
fn a_declarer_owns_only_a_file_it_could_remove_from_its_directory_itself() {
    // A table of uid 65534; root's 0755 directory, allowed by its creator;
    // a file of uid 65534 in it, which uid 65534 cannot remove.
    let dir = TestDir::in_dir(Path::new("/dev/shm"), "roots", 0o755);
    let options = livereg::TableOptions {
        owned_dirs: vec![dir.0.clone()],
        ..long_options()
    };
    let temp = TempTable::new("owned-dir-rule", &options);
    for side in ["", ".owned", ".owned-dirs"] {
        let path = format!("/dev/shm/{}{side}", temp.name);
        std::os::unix::fs::lchown(path, Some(65_534), Some(65_534)).unwrap();
    }
    let theirs = dir.0.join("theirs");
    std::fs::write(&theirs, b"keep me").unwrap();
    std::os::unix::fs::chown(&theirs, Some(65_534), Some(65_534)).unwrap();
    // Declared by uid 65534: refused, naming the directory.
    let out = other_user::livereg_as(65_534)
        .args(["worker", &temp.name, "--instance", "22"])
        .args(["--own", theirs.to_str().unwrap()])
        .output()
        .unwrap();
    let message = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{message}");
    assert!(
        message.contains("may not remove names from its directory"),
        "{message}"
    );
    // Its record written by hand, as a writer of the table could: the
    // root reaper leaves the file where its declarer could not remove it.
    forge(&temp.name, owner_at(0), &owner_record(65_534, &[65_534]));
    forge(
        &temp.name,
        file_at(0, 0),
        &file_record(0, b"theirs", &theirs),
    );
    left_in_place_and_counted(&temp, &theirs);
    assert_eq!(std::fs::read(&theirs).unwrap(), b"keep me");
}

/// A table of uid 65534 allowing `dir`, with a file of uid 65534 there
/// and a record of its declaration by uid 65534 (with `groups`), ended:
/// what a writer of the table could write. Returns the table and the file.
fn declared_by_nobody(tag: &str, dir: &Path, groups: &[u32]) -> (TempTable, PathBuf) {
    let options = livereg::TableOptions {
        owned_dirs: vec![dir.to_path_buf()],
        ..long_options()
    };
    let temp = TempTable::new(tag, &options);
    for side in ["", ".owned", ".owned-dirs"] {
        let path = format!("/dev/shm/{}{side}", temp.name);
        std::os::unix::fs::lchown(path, Some(65_534), Some(65_534)).unwrap();
    }
    let theirs = dir.join("theirs");
    std::fs::write(&theirs, b"keep me").unwrap();
    std::os::unix::fs::chown(&theirs, Some(65_534), Some(65_534)).unwrap();
    forge(&temp.name, owner_at(0), &owner_record(65_534, groups));
    forge(
        &temp.name,
        file_at(0, 0),
        &file_record(0, b"theirs", &theirs),
    );
    (temp, theirs)
}

#[test]
fn a_removal_is_judged_by_the_kernel_as_its_declarer_would_be_judged() {
    // The directory's bits let others write; its ACL denies uid 65534
    // (`user:65534:r-x`). The bits pass the reaper's look; the removal,
    // made as uid 65534, is the kernel's to refuse, at the moment it is
    // made (no name swapped in after the look can be removed beyond what
    // the declarer could remove).
    let dir = TestDir::in_dir(Path::new("/dev/shm"), "acl", 0o777);
    let acl: Vec<u8> = 2u32
        .to_le_bytes()
        .into_iter()
        .chain(
            [
                (1u16, 7u16, u32::MAX),
                (2, 5, 65_534),
                (4, 7, u32::MAX),
                (0x10, 7, u32::MAX),
                (0x20, 7, u32::MAX),
            ]
            .iter()
            .flat_map(|(tag, perm, id)| {
                [
                    tag.to_le_bytes().to_vec(),
                    perm.to_le_bytes().to_vec(),
                    id.to_le_bytes().to_vec(),
                ]
                .concat()
            }),
        )
        .collect();
    let (path, name) = (
        std::ffi::CString::new(dir.0.as_os_str().as_encoded_bytes()).unwrap(),
        c"system.posix_acl_access",
    );
    // SAFETY: both strings are NUL-terminated and `acl` is valid for its
    // length; all outlive the call.
    let rc = unsafe {
        libc::setxattr(
            path.as_ptr(),
            name.as_ptr(),
            acl.as_ptr().cast(),
            acl.len(),
            0,
        )
    };
    assert_eq!(rc, 0, "{}", std::io::Error::last_os_error());
    let (temp, theirs) = declared_by_nobody("owned-acl", &dir.0, &[65_534]);
    left_in_place_and_counted(&temp, &theirs);
    assert_eq!(std::fs::read(&theirs).unwrap(), b"keep me");
}

#[test]
fn groups_a_record_claims_are_not_believed_where_others_may_write_the_records() {
    // Root's directory, group 4242, mode 0775; uid 65534 is in no group
    // 4242, whatever its record says.
    let dir = TestDir::in_dir(Path::new("/dev/shm"), "group", 0o775);
    std::os::unix::fs::chown(&dir.0, None, Some(4242)).unwrap();
    let (temp, theirs) = declared_by_nobody("owned-groups", &dir.0, &[65_534, 4242]);
    left_in_place_and_counted(&temp, &theirs);
    assert_eq!(std::fs::read(&theirs).unwrap(), b"keep me");
}

#[test]
fn root_owns_no_file_in_a_table_others_may_write() {
    // Root's table, mode 660: any member of its group could write a root
    // declarer into the records, naming any root file in /dev/shm (another
    // table, say). Refused at declaration, and never believed at removal.
    let options = livereg::TableOptions {
        mode: 0o660,
        ..long_options()
    };
    let temp = TempTable::new("owned-root-shared", &options);
    let precious = ShmFile::new("root-shared", 8);
    match temp.table.own_file(&precious.0) {
        Err(Error::Permission(message)) => {
            assert!(message.contains("no one else may write"), "{message}")
        }
        other => panic!("expected Permission, got {other:?}"),
    }
    let name = precious.0.file_name().unwrap().as_encoded_bytes().to_vec();
    forge(&temp.name, owner_at(0), &owner_record(0, &[0]));
    forge(
        &temp.name,
        file_at(0, 0),
        &file_record(0, &name, &precious.0),
    );
    left_in_place_and_counted(&temp, &precious.0);
}

#[test]
fn a_name_with_a_control_character_is_never_owned_nor_logged() {
    let temp = TempTable::new("owned-control", &long_options());
    let forged = ShmFile::named("control\n\x1b[2Ktable 'prod': removed all");
    std::fs::write(&forged.0, b"x").unwrap();
    match temp.table.own_file(&forged.0) {
        Err(Error::InvalidArgument(message)) => {
            assert!(
                message.contains("control character") && !message.contains('\n'),
                "{message}"
            )
        }
        other => panic!("expected InvalidArgument, got {other:?}"),
    }
    let name = forged.0.file_name().unwrap().as_encoded_bytes().to_vec();
    forge(&temp.name, owner_at(0), &owner_record(0, &[0]));
    forge(&temp.name, file_at(0, 0), &file_record(0, &name, &forged.0));
    left_in_place_and_counted(&temp, &forged.0);
}

#[test]
fn a_reader_of_the_table_cannot_open_its_records_to_hold_an_owner_s_lock() {
    // A table others may read: its records are its owner's alone, so no
    // mere reader can take an owner's lock and keep an ended owner alive.
    let options = livereg::TableOptions {
        mode: 0o644,
        ..long_options()
    };
    let temp = TempTable::new("owned-reader", &options);
    let records = owned_forgery::records_path(&temp.name);
    assert_eq!(
        std::fs::metadata(&records).unwrap().permissions().mode() & 0o777,
        0o600
    );
    let read_as_nobody = |path: &Path| {
        Command::new("setpriv")
            .args([
                "--reuid=65534",
                "--regid=65534",
                "--clear-groups",
                "/bin/cat",
            ])
            .arg(path)
            .output()
            .unwrap()
    };
    let table = Path::new("/dev/shm").join(&temp.name);
    assert!(
        read_as_nobody(&table).status.success(),
        "the reader reads the table"
    );
    let out = read_as_nobody(&records);
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("Permission denied"),
        "a reader opened the records: {out:?}"
    );
    let file = ShmFile::new("reader", 8);
    let mut worker = owner(&temp.name, 33, &[&file], &[]);
    let mut reaper = temp.table.reaper().build().unwrap();
    worker.signal(libc::SIGKILL);
    let _ = worker.child.wait();
    assert_eq!(
        scan_until_settled(&mut reaper, &temp.table),
        vec![file.0.clone()]
    );
}

#[test]
fn removing_a_table_removes_what_ended_owners_left_and_names_the_live_ones() {
    let temp = TempTable::new("owned-rm", &long_options());
    let (kept, left) = (ShmFile::new("rm-alive", 8), ShmFile::new("rm-ended", 8));
    let alive = owner(&temp.name, 31, &[&kept], &[]);
    let mut ended = owner(&temp.name, 32, &[&left], &[]);
    ended.signal(libc::SIGKILL);
    let _ = ended.child.wait();
    let owners = owned_in(&temp.table).owners;
    assert_eq!(owners.iter().filter(|o| o.ended).count(), 1, "{owners:?}");
    // No reaper ran: `rm` removes what the ended owner left, and names the
    // live owner, whose declaration goes with the table.
    let out = Command::new(env!("CARGO_BIN_EXE_livereg"))
        .args(["rm", &temp.name])
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{said}");
    assert!(!left.exists(), "an ended owner's file outlived its table");
    assert!(kept.exists(), "removed while its maker lives");
    let pid = alive.child.id().to_string();
    assert!(
        said.contains("1 live processes own files") && said.contains(&pid),
        "{said}"
    );
    for side in ["", ".owned", ".owned-dirs"] {
        let path = format!("/dev/shm/{}{side}", temp.name);
        assert!(!Path::new(&path).exists(), "{path} left");
    }
}

#[test]
fn a_process_owns_at_most_64_files_and_the_limit_is_named() {
    let temp = TempTable::new("owned-limit", &long_options());
    let mine = Table::open(&temp.name).unwrap();
    let files: Vec<ShmFile> = (0..65).map(|_| ShmFile::new("limit", 1)).collect();
    for file in &files[..64] {
        mine.own_file(&file.0).unwrap();
    }
    // Declaring one again is no new file.
    mine.own_file(&files[0].0).unwrap();
    match mine.own_file(&files[64].0) {
        Err(Error::Full { message, capacity }) => {
            assert_eq!(capacity, Some(64));
            assert!(message.contains("64 files") && message.contains(files[64].text()));
        }
        other => panic!("expected Full, got {other:?}"),
    }
    assert!(mine.disown_file(&files[0].0).unwrap());
    assert!(!mine.disown_file(&files[0].0).unwrap(), "once");
    mine.own_file(&files[64].0).unwrap();
    let owned = owned_in(&temp.table);
    assert_eq!(owned.owners[0].files, 64);
    assert_eq!(owned.owners[0].pid, std::process::id());
    // This process lives: nothing of it is removed.
    let mut reaper = temp.table.reaper().build().unwrap();
    assert!(reaper.scan().unwrap().removed_files.is_empty());
    // Disowned, the files stay; the handle closed owning nothing, its
    // record is given back.
    for file in &files[1..] {
        assert!(mine.disown_file(&file.0).unwrap());
    }
    drop(mine);
    assert!(owned_in(&temp.table).owners.is_empty());
    assert!(reaper.scan().unwrap().removed_files.is_empty());
    assert!(files.iter().all(ShmFile::exists));
}

#[test]
fn a_handle_closed_while_its_process_owns_files_keeps_them_owned_until_it_ends() {
    let temp = TempTable::new("owned-closed", &long_options());
    let file = ShmFile::new("closed", 8);
    let mine = Table::open(&temp.name).unwrap();
    mine.own_file(&file.0).unwrap();
    drop(mine);
    let mut reaper = temp.table.reaper().build().unwrap();
    assert!(
        reaper.scan().unwrap().removed_files.is_empty(),
        "this process lives"
    );
    let owned = owned_in(&temp.table);
    assert_eq!(owned.owners[0].files, 1);
    assert!(file.exists());
}

#[test]
fn a_file_owned_by_a_process_that_died_while_no_reaper_ran_is_removed_by_the_next() {
    let temp = TempTable::new("owned-noreaper", &long_options());
    let file = ShmFile::new("noreaper", 64);
    let mut worker = owner(&temp.name, 4, &[&file], &[]);
    worker.signal(libc::SIGKILL);
    let _ = worker.child.wait();
    assert!(file.exists(), "no reaper ran");
    let mut reaper = temp.table.reaper().build().unwrap();
    assert_eq!(
        scan_until_settled(&mut reaper, &temp.table),
        vec![file.0.clone()]
    );
    assert!(!file.exists());
}

#[test]
fn a_reaper_killed_part_way_leaves_the_rest_to_the_next_and_a_file_gone_is_no_error() {
    let temp = TempTable::new("owned-midway", &long_options());
    let (done, left) = (ShmFile::new("done", 8), ShmFile::new("left", 8));
    let mut worker = owner(&temp.name, 5, &[&done, &left], &[]);
    worker.signal(libc::SIGKILL);
    let _ = worker.child.wait();
    // As a reaper killed after removing one file, before freeing its record.
    std::fs::remove_file(&done.0).unwrap();
    let mut reaper = temp.table.reaper().build().unwrap();
    assert_eq!(
        scan_until_settled(&mut reaper, &temp.table),
        vec![left.0.clone()]
    );
    let owned = owned_in(&temp.table);
    assert_eq!((owned.removed_total, owned.refused_total), (1, 0));
    assert!(owned.owners.is_empty());
}

#[test]
fn a_forked_child_keeps_nothing_of_its_parent_s_files() {
    let temp = TempTable::new("owned-fork", &long_options());
    let file = ShmFile::new("fork", 8);
    let mut reaper = temp.table.reaper().build().unwrap();
    let mut worker = owner(&temp.name, 6, &[&file], &["--fork-child"]);
    let line = worker.wait_for("forked");
    let child: libc::pid_t = line["forked ".len()..].parse().unwrap();
    worker.signal(libc::SIGKILL);
    // The child lives on, holding copies of the worker's descriptors.
    assert_eq!(
        scan_until_settled(&mut reaper, &temp.table),
        vec![file.0.clone()]
    );
    // SAFETY: `kill` has no memory effects; the child is the worker's.
    assert_eq!(unsafe { libc::kill(child, 0) }, 0, "the child still lives");
    // SAFETY: as above.
    unsafe { libc::kill(child, libc::SIGKILL) };
}

#[test]
fn exec_ends_the_declarations() {
    let temp = TempTable::new("owned-exec", &long_options());
    let file = ShmFile::new("exec", 8);
    let mut reaper = temp.table.reaper().build().unwrap();
    let worker = owner(&temp.name, 7, &[&file], &["--exec-sleep"]);
    assert_eq!(
        scan_until_settled(&mut reaper, &temp.table),
        vec![file.0.clone()]
    );
    // SAFETY: `kill` has no memory effects.
    assert_eq!(
        unsafe { libc::kill(worker.child.id() as i32, 0) },
        0,
        "sleep runs"
    );
}

#[test]
fn a_clean_exit_removes_them_too() {
    let temp = TempTable::new("owned-exit", &long_options());
    let file = ShmFile::new("exit", 8);
    let mut reaper = temp.table.reaper().build().unwrap();
    let mut worker = owner(&temp.name, 8, &[&file], &["--exit-after", "200ms"]);
    worker.wait_for("deregistered");
    let _ = worker.child.wait();
    assert_eq!(
        scan_until_settled(&mut reaper, &temp.table),
        vec![file.0.clone()]
    );
}

#[test]
fn livereg_run_owns_what_its_program_makes_once_it_exists() {
    let temp = TempTable::new("owned-run", &long_options());
    let file = ShmFile::named("run");
    let mut reaper = temp.table.reaper().build().unwrap();
    let script = format!("sleep 0.2; echo made > {}; exec sleep 60", file.text());
    let mut run = Command::new(env!("CARGO_BIN_EXE_livereg"))
        .args(["run", &temp.name, "--instance", "9", "--own", file.text()])
        .args(["--", "sh", "-c", &script])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while owned_in(&temp.table).owners.iter().all(|o| o.files == 0) {
        assert!(Instant::now() < deadline, "never owned");
        std::thread::sleep(Duration::from_millis(10));
    }
    run.kill().unwrap();
    let _ = run.wait();
    assert_eq!(
        scan_until_settled(&mut reaper, &temp.table),
        vec![file.0.clone()]
    );
}

#[test]
fn an_allowed_directory_reached_through_a_link_is_never_followed() {
    let real = std::env::temp_dir().join(unique_name("owned-real-dir"));
    let link = std::env::temp_dir().join(unique_name("owned-dir-link"));
    std::fs::create_dir(&real).unwrap();
    std::os::unix::fs::symlink(&real, &link).unwrap();
    let options = livereg::TableOptions {
        owned_dirs: vec![link.clone()],
        ..long_options()
    };
    let temp = TempTable::new("owned-dir-link", &options);
    let file = link.join("ring");
    std::fs::write(&file, b"x").unwrap();
    let refused = temp.table.own_file(&file);
    let kept = real.join("ring").exists();
    let _ = std::fs::remove_file(real.join("ring"));
    let _ = std::fs::remove_file(&link);
    let _ = std::fs::remove_dir(&real);
    assert!(refused.is_err(), "declared through a link: {refused:?}");
    assert!(kept);
}

/// The inode at `path` (not following a link), if anything is there.
fn inode_at(path: &Path) -> Option<u64> {
    use std::os::unix::fs::MetadataExt;
    path.symlink_metadata().ok().map(|meta| meta.ino())
}

#[test]
fn livereg_run_owns_the_file_its_program_makes_anew_under_the_same_name() {
    let temp = TempTable::new("owned-run-anew", &long_options());
    let file = ShmFile::named("run-anew");
    let mut reaper = temp.table.reaper().build().unwrap();
    // Made, removed, then made again (a new inode: written beside and
    // renamed over the name) after the wrapper has surely declared the
    // first; then the program lives on.
    let script = format!(
        "head -c 65536 /dev/zero > {f}; sleep 1; rm {f}; \
         head -c 65536 /dev/zero > {f}.new; mv {f}.new {f}; exec sleep 60",
        f = file.text()
    );
    let mut run = Command::new(env!("CARGO_BIN_EXE_livereg"))
        .args(["run", &temp.name, "--instance", "9", "--own", file.text()])
        .args(["--", "sh", "-c", &script])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    let first = loop {
        if let (Some(inode), true) = (
            inode_at(&file.0),
            owned_in(&temp.table).owners.iter().any(|o| o.files == 1),
        ) {
            break inode;
        }
        assert!(Instant::now() < deadline, "never owned");
        std::thread::sleep(Duration::from_millis(10));
    };
    while inode_at(&file.0).is_none_or(|inode| inode == first) {
        assert!(Instant::now() < deadline, "never made anew");
        std::thread::sleep(Duration::from_millis(10));
    }
    // The wrapper looks every 20 ms; a generous margin for it to see the
    // new file before it is killed.
    std::thread::sleep(Duration::from_secs(1));
    run.kill().unwrap();
    let _ = run.wait();
    let removed = scan_until_settled(&mut reaper, &temp.table);
    let _ = std::fs::remove_file(format!("{}.new", file.text()));
    assert!(!file.exists(), "the file made anew outlived its maker");
    assert_eq!(removed, vec![file.0.clone()]);
}
