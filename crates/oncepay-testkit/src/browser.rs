//! A real headless Chromium, driven over the W3C WebDriver protocol by
//! Debian's `chromedriver`. The protocol is JSON over HTTP, so this speaks it
//! with the workspace's own reqwest: a few dozen lines instead of a browser
//! automation crate and its own HTTP stack (fantoccini brings hyper and a
//! webdriver types crate; chromiumoxide a DevTools client). What the tests
//! need is small: open pages, find elements, click, type, run a script,
//! reload, open a second tab, take screenshots.

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use serde_json::{json, Value};
use tokio::process::{Child, Command};

use crate::ports::free_port;
use crate::ready;

/// The WebDriver element id key.
const ELEMENT: &str = "element-6066-11e4-a52e-4f735466cecf";

/// A chromedriver process and one browser session in it.
pub struct Browser {
    http: reqwest::Client,
    session: String,
    base: String,
    _driver: Child,
}

/// Why the browser could not do something.
pub type BrowserResult<T> = Result<T, String>;

/// Whether Debian's `chromium` and `chromium-driver` are installed; tests
/// that need them say so loudly when they are not.
pub fn available() -> bool {
    Path::new("/usr/bin/chromedriver").exists() && Path::new("/usr/bin/chromium").exists()
}

impl Browser {
    /// Starts chromedriver on a free port and a headless Chromium with a
    /// fresh profile and a phone-sized window (`width` × `height`).
    pub async fn start(width: u32, height: u32) -> BrowserResult<Browser> {
        let port = free_port()?;
        let driver = Command::new("/usr/bin/chromedriver")
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| format!("starting chromedriver: {e}"))?;
        let base = format!("http://127.0.0.1:{port}");
        ready::until_ready(&format!("{base}/status"), Duration::from_secs(20)).await?;
        let profile = std::env::temp_dir().join(format!("oncepay-chromium-{}", fastrand::u64(..)));
        let args = vec![
            "--headless=new".to_string(),
            "--no-sandbox".into(),
            "--disable-gpu".into(),
            "--disable-dev-shm-usage".into(),
            "--disable-quic".into(),
            "--no-first-run".into(),
            "--disable-background-networking".into(),
            "--disable-component-update".into(),
            "--disable-sync".into(),
            "--disable-extensions".into(),
            format!("--window-size={width},{height}"),
            format!("--user-data-dir={}", profile.display()),
        ];
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(60))
            .build()
            .map_err(|e| e.to_string())?;
        let created: Value = http
            .post(format!("{base}/session"))
            .json(&json!({"capabilities": {"alwaysMatch": {
                "browserName": "chrome",
                "goog:chromeOptions": {"binary": "/usr/bin/chromium", "args": args}
            }}}))
            .send()
            .await
            .map_err(|e| format!("new session: {e}"))?
            .json()
            .await
            .map_err(|e| format!("new session: {e}"))?;
        let session = created["value"]["sessionId"]
            .as_str()
            .ok_or_else(|| format!("no session: {created}"))?
            .to_string();
        Ok(Browser {
            http,
            session,
            base,
            _driver: driver,
        })
    }

    async fn call(&self, method: reqwest::Method, path: &str, body: Value) -> BrowserResult<Value> {
        let url = format!("{}/session/{}{path}", self.base, self.session);
        let request = self.http.request(method, &url);
        let request = if body.is_null() {
            request
        } else {
            request.json(&body)
        };
        let answer: Value = request
            .send()
            .await
            .map_err(|e| format!("{path}: {e}"))?
            .json()
            .await
            .map_err(|e| format!("{path}: {e}"))?;
        if let Some(error) = answer["value"]["error"].as_str() {
            return Err(format!("{path}: {error}: {}", answer["value"]["message"]));
        }
        Ok(answer["value"].clone())
    }

    /// Opens `url` in the current tab.
    pub async fn goto(&self, url: &str) -> BrowserResult<()> {
        self.call(reqwest::Method::POST, "/url", json!({"url": url}))
            .await
            .map(drop)
    }

    /// Reloads the current page.
    pub async fn reload(&self) -> BrowserResult<()> {
        self.call(reqwest::Method::POST, "/refresh", json!({}))
            .await
            .map(drop)
    }

    /// The element matching a CSS selector.
    pub async fn find(&self, css: &str) -> BrowserResult<String> {
        let found = self
            .call(
                reqwest::Method::POST,
                "/element",
                json!({"using": "css selector", "value": css}),
            )
            .await?;
        found[ELEMENT]
            .as_str()
            .map(str::to_string)
            .ok_or_else(|| format!("{css}: no element in {found}"))
    }

    /// Clicks an element (as a user would: it must be visible).
    pub async fn click(&self, element: &str) -> BrowserResult<()> {
        self.call(
            reqwest::Method::POST,
            &format!("/element/{element}/click"),
            json!({}),
        )
        .await
        .map(drop)
    }

    /// Types into an element (`\u{E007}` is Enter).
    pub async fn type_into(&self, element: &str, text: &str) -> BrowserResult<()> {
        self.call(
            reqwest::Method::POST,
            &format!("/element/{element}/value"),
            json!({"text": text}),
        )
        .await
        .map(drop)
    }

    /// Clears an input.
    pub async fn clear(&self, element: &str) -> BrowserResult<()> {
        self.call(
            reqwest::Method::POST,
            &format!("/element/{element}/clear"),
            json!({}),
        )
        .await
        .map(drop)
    }

    /// Runs `script` (a function body; `arguments` as given) in the page.
    pub async fn eval(&self, script: &str, args: Value) -> BrowserResult<Value> {
        self.call(
            reqwest::Method::POST,
            "/execute/sync",
            json!({"script": script, "args": args}),
        )
        .await
    }

    /// An attribute of the first element matching `css` (`None` if absent).
    pub async fn attribute(&self, css: &str, name: &str) -> BrowserResult<Option<String>> {
        let value = self
            .eval(
                "var e = document.querySelector(arguments[0]); return e ? e.getAttribute(arguments[1]) : null;",
                json!([css, name]),
            )
            .await?;
        Ok(value.as_str().map(str::to_string))
    }

    /// Waits (up to `patience`) until `css`'s attribute `name` is `value`.
    pub async fn wait_attribute(
        &self,
        css: &str,
        name: &str,
        value: &str,
        patience: Duration,
    ) -> BrowserResult<()> {
        let reached = ready::until(patience, || async {
            self.attribute(css, name).await.ok().flatten().as_deref() == Some(value)
        })
        .await;
        match reached {
            Ok(()) => Ok(()),
            Err(waited) => Err(format!(
                "{css}[{name}] never became {value:?} in {waited:?}; it is {:?}",
                self.attribute(css, name).await.ok().flatten()
            )),
        }
    }

    /// Opens a new tab and switches to it; returns its handle.
    pub async fn new_tab(&self) -> BrowserResult<String> {
        let created = self
            .call(reqwest::Method::POST, "/window/new", json!({"type": "tab"}))
            .await?;
        let handle = created["handle"]
            .as_str()
            .ok_or("no window handle")?
            .to_string();
        self.switch_to(&handle).await?;
        Ok(handle)
    }

    /// The current tab's handle.
    pub async fn tab(&self) -> BrowserResult<String> {
        let handle = self
            .call(reqwest::Method::GET, "/window", Value::Null)
            .await?;
        handle
            .as_str()
            .map(str::to_string)
            .ok_or_else(|| "no window handle".into())
    }

    /// Switches to a tab.
    pub async fn switch_to(&self, handle: &str) -> BrowserResult<()> {
        self.call(reqwest::Method::POST, "/window", json!({"handle": handle}))
            .await
            .map(drop)
    }

    /// Saves a PNG screenshot of the current tab at `path`.
    pub async fn screenshot(&self, path: &Path) -> BrowserResult<()> {
        use base64::Engine;
        let encoded = self
            .call(reqwest::Method::GET, "/screenshot", Value::Null)
            .await?;
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(encoded.as_str().ok_or("no screenshot")?)
            .map_err(|e| format!("screenshot: {e}"))?;
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(|e| e.to_string())?;
        }
        std::fs::write(path, bytes).map_err(|e| format!("{}: {e}", path.display()))
    }

    /// Ends the session (the driver process ends with this value).
    pub async fn quit(self) {
        let _ = self
            .http
            .delete(format!("{}/session/{}", self.base, self.session))
            .send()
            .await;
    }
}

/// Where `make axe` installs axe-core (npm): the accessibility checker
/// the checkout's tests run inside the page.
pub fn axe_script() -> std::path::PathBuf {
    std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../target/axe/node_modules/axe-core/axe.min.js")
}

impl Browser {
    /// Runs axe-core on the page as it is now, for WCAG 2.x A and AA (2.2
    /// included); returns each violation as `rule: nodes (first target)`.
    pub async fn axe(&self) -> BrowserResult<Vec<String>> {
        let source = std::fs::read_to_string(axe_script())
            .map_err(|e| format!("axe-core is missing (make axe): {e}"))?;
        self.eval(
            &format!("{source}\n;window.__axe = null; return true;"),
            Value::Array(Vec::new()),
        )
        .await?;
        self.eval(
            "axe.run(document, {runOnly: {type: 'tag', values: ['wcag2a', 'wcag2aa', 'wcag21a', 'wcag21aa', 'wcag22aa']}})
               .then(function (r) { window.__axe = r.violations.map(function (v) {
                   return v.id + ': ' + v.nodes.length + ' (' + v.nodes[0].target.join(' ') + ') ' + v.help; }); },
                     function (e) { window.__axe = ['axe failed: ' + e]; });
             return true;",
            Value::Array(Vec::new()),
        )
        .await?;
        for _ in 0..200 {
            let found = self
                .eval("return window.__axe;", Value::Array(Vec::new()))
                .await?;
            if let Value::Array(items) = found {
                return Ok(items
                    .into_iter()
                    .map(|v| v.as_str().unwrap_or_default().to_string())
                    .collect());
            }
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
        Err("axe-core gave no answer in 10 s".into())
    }
}
