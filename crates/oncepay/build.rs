//! Records the commit the binary is built from (`oncepay_build_info`), and
//! lists `migrations/V<n>__<name>.sql` for `store::migrate::MIGRATIONS` in
//! version order (V10 after V9), so adding a migration is adding its file:
//! nothing else names it.

use std::fmt::Write as _;

fn main() {
    commit();
    migrations();
}

fn commit() {
    let commit = std::process::Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "unknown".into());
    println!("cargo:rustc-env=ONCEPAY_GIT_COMMIT={commit}");
    // A new commit moves the reflog: rebuild only the crate, then.
    for path in ["../../.git/HEAD", "../../.git/logs/HEAD"] {
        if std::path::Path::new(path).exists() {
            println!("cargo:rerun-if-changed={path}");
        }
    }
}

fn migrations() {
    let dir = std::path::Path::new(&std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets it"))
        .join("migrations");
    println!("cargo:rerun-if-changed={}", dir.display());
    let mut files: Vec<(u32, String, std::path::PathBuf)> = std::fs::read_dir(&dir)
        .expect("migrations/ exists")
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "sql"))
        .map(|p| {
            let name = p
                .file_stem()
                .and_then(|s| s.to_str())
                .expect("a UTF-8 file name")
                .to_string();
            let version = name
                .strip_prefix('V')
                .and_then(|v| v.split("__").next())
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| panic!("{name}: not V<n>__<name>.sql"));
            (version, name, p)
        })
        .collect();
    files.sort();
    let mut out = String::from("&[\n");
    for (_, name, path) in &files {
        writeln!(
            out,
            "    ({name:?}, include_str!({:?})),",
            path.display().to_string()
        )
        .expect("writing to a String");
    }
    out.push(']');
    let target = std::path::Path::new(&std::env::var("OUT_DIR").expect("cargo sets it"))
        .join("migrations.rs");
    std::fs::write(target, out).expect("OUT_DIR is writable");
}
