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
