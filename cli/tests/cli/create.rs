//! `livereg create`: what it refuses.

use super::*;

#[test]
fn create_refuses_an_existing_table_a_bad_name_and_a_short_grace() {
    let (name, _guard) = created(
        "create",
        &[
            "--capacity",
            "4",
            "--timeout",
            "2s",
            "--grace",
            "5s",
            "--mode",
            "640",
        ],
    );
    let mode = std::fs::metadata(format!("/dev/shm/{name}")).unwrap();
    assert_eq!(
        std::os::unix::fs::PermissionsExt::mode(&mode.permissions()) & 0o777,
        0o640
    );
    fails_with(&livereg(&["create", &name]), &format!("table '{name}'"));
    fails_with(&livereg(&["create", "bad name"]), "contains ' '");
    let other = unique_name("short-grace");
    fails_with(
        &livereg(&["create", &other, "--timeout", "5s", "--grace", "1s"]),
        "grace >= timeout",
    );
    assert_eq!(
        livereg(&["create", &other, "--timeout", "soon"])
            .status
            .code(),
        Some(2),
        "usage error"
    );
    assert_eq!(livereg(&["frobnicate"]).status.code(), Some(2));
}

/// A user who may not remove what another user planted at `NAME.dying`
/// (a link of root's, in the sticky /dev/shm) cannot create the table:
/// the refusal names the file, what is there and whose, and who may
/// remove it; nothing of the table is left, and the link is untouched.
#[test]
fn create_refuses_a_death_words_name_it_may_not_remove_naming_the_file_and_who_may() {
    let name = unique_name("create-planted-dying");
    let _guard = UnlinkOnDrop(name.clone());
    let dying = std::path::PathBuf::from(format!("/dev/shm/{name}.dying"));
    std::os::unix::fs::symlink("/etc/hostname", &dying).unwrap();
    let refused = crate::other_user::livereg_as(65534)
        .args(["create", &name])
        .output()
        .unwrap();
    let link_kept = std::fs::read_link(&dying).ok();
    let table_left = std::path::Path::new(&format!("/dev/shm/{name}")).exists();
    let _ = std::fs::remove_file(&dying);
    let path = dying.display().to_string();
    fails_with(
        &refused,
        &format!("{path} is a symbolic link owned by uid 0 (to /etc/hostname) that uid 65534 may not remove"),
    );
    fails_with(
        &refused,
        &format!("remove it (it is not the table's) as root: rm '{path}', and start again"),
    );
    assert!(!table_left, "the table was left behind");
    assert_eq!(link_kept, Some("/etc/hostname".into()));
}
