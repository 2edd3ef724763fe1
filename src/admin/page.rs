//! The page's frame: the layout every page shares, its little CSS, and the forms of the
//! actions (shown only to a viewer with full access, each carrying the CSRF token).

use maud::{DOCTYPE, Markup, html};

use super::Access;

/// The headers every answer of the page carries: it may not be framed (no clicking
/// its buttons through another site), nothing but its own embedded style runs or loads,
/// a form posts only to the page, nothing is kept by a cache (its lists hold customer
/// data), no address (with its query) leaves for another site in a `Referer` (the page's
/// own get it, and with it the page's origin in `Origin`), no type is guessed.
pub(super) fn hardening() -> [(&'static str, &'static str); 5] {
    static POLICY: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    let policy = POLICY.get_or_init(|| {
        use base64::Engine as _;
        use sha2::Digest as _;
        // The one style and the one script the page embeds, by their hashes: no other
        // style or script runs; the script reads the page's own site only.
        let hash = |text: &str| {
            base64::engine::general_purpose::STANDARD.encode(sha2::Sha256::digest(text))
        };
        let (style, script) = (hash(CSS), hash(LIVE));
        format!(
            "default-src 'none'; style-src 'sha256-{style}'; script-src 'sha256-{script}'; \
             connect-src 'self'; img-src 'self' data:; form-action 'self'; \
             frame-ancestors 'none'; base-uri 'self'"
        )
    });
    [
        ("content-security-policy", policy.as_str()),
        ("x-frame-options", "DENY"),
        ("x-content-type-options", "nosniff"),
        ("cache-control", "no-store"),
        ("referrer-policy", "same-origin"),
    ]
}

/// The overview's one script: every 5 s it reads the overview's live part (its counts
/// and charts, rendered and escaped on the server) and puts it in place, with no reload
/// of the page, while the page is in view; a read that fails or is redirected (a login
/// page) leaves what is shown.
pub(super) const LIVE: &str = "(function(){var live=document.getElementById('live');if(!live)return;\
setInterval(function(){if(document.hidden)return;fetch(location.pathname+'?part=live',{credentials:'same-origin'})\
.then(function(r){return r.ok&&!r.redirected?r.text():null}).then(function(t){if(t!==null){live.innerHTML=t;\
live.setAttribute('data-refreshed',String(Date.now()));}}).catch(function(){});},5000);})();";

/// The page's style: embedded, nothing fetched.
const CSS: &str = "
body{font:14px/1.4 system-ui,sans-serif;margin:0;color:#1d2329;background:#f6f7f9}
header{background:#1d2329;color:#fff;padding:.6em 1.2em;display:flex;gap:1.2em;align-items:center}
header a{color:#cfe3ff;text-decoration:none}header b{margin-right:1em}
header .who{margin-left:auto;color:#aab}
main{padding:1em 1.2em}
h1{font-size:1.3em;margin:.2em 0 .6em}h2{font-size:1.1em;margin:1.2em 0 .4em}
table{border-collapse:collapse;background:#fff;width:100%;margin-bottom:1em}
th,td{border:1px solid #dde1e6;padding:.3em .5em;text-align:left;vertical-align:top}
th{background:#eef1f4;font-weight:600}
td.err{color:#a4262c;max-width:32em;word-break:break-word}
.cards{display:flex;gap:1em;flex-wrap:wrap}
.card{background:#fff;border:1px solid #dde1e6;padding:.6em 1em;min-width:11em}
.card .n{font-size:1.6em;font-weight:600}
.charts{display:flex;gap:1.5em;flex-wrap:wrap;margin-top:1em}
.chart{margin:0;background:#fff;border:1px solid #dde1e6;padding:.5em .8em}
.chart .small{color:#5b6670;font-size:.85em}
a.card{color:inherit;text-decoration:none}
#picture{overflow:auto;background:#fff;border:1px solid #dde1e6}
.bad{color:#a4262c}.ok{color:#107c10}
form.inline{display:inline;margin:0}
button{cursor:pointer;padding:.15em .6em}
pre{background:#fff;border:1px solid #dde1e6;padding:.6em;overflow:auto}
details.all pre{white-space:pre-wrap;word-break:break-word;max-height:24em}
pre.whole{white-space:pre-wrap;word-break:break-word}div.err pre{color:#a4262c}
table.fields{width:auto;min-width:40em}table.fields th{width:12em}
.tabs a.here{font-weight:600;color:inherit;text-decoration:none}span.when{border-bottom:1px dotted #889}
.flash{background:#e7f3e7;border:1px solid #107c10;padding:.4em .8em;margin-bottom:1em}
input,select{padding:.15em .3em}
header form.search input{width:16em}
";

/// What every page is given: where it is mounted, who looks, and their CSRF token.
pub(super) struct Frame {
    /// The mount point with its trailing slash, for `<base>`: every link is relative.
    pub(super) base: String,
    /// The overview's own path: the mount point itself.
    pub(super) home: String,
    pub(super) who: String,
    pub(super) access: Access,
    pub(super) csrf: String,
}

impl Frame {
    /// Whether action buttons are shown.
    pub(super) fn acts(&self) -> bool {
        self.access == Access::Full
    }

    /// The page: the header's links, the title, a notice if any, the body.
    pub(super) fn page(&self, title: &str, notice: Option<&str>, body: Markup) -> Markup {
        html! {
            (DOCTYPE)
            html lang="en" {
                head {
                    meta charset="utf-8";
                    base href=(self.base);
                    title { (title) " · orderly" }
                    style { (maud::PreEscaped(CSS)) }
                }
                body {
                    header {
                        b { "orderly" }
                        a href=(self.home) { "Overview" }
                        a href="outbox" { "Dead events" }
                        a href="flows" { "Parked flows" }
                        a href="timers" { "Dead timers" }
                        a href="records" { "Stuck records" }
                        a href="audit" { "Audit" }
                        form.search method="get" action="search" {
                            input type="search" name="q" placeholder="reference, key, message id";
                        }
                        span.who {
                            (self.who) " · "
                            (if self.acts() { "full access" } else { "read-only" })
                        }
                    }
                    main {
                        h1 { (title) }
                        @if let Some(notice) = notice {
                            p.flash id="notice" { (notice) }
                        }
                        (body)
                    }
                }
            }
        }
    }

    /// A POST form of hidden fields and one button, or nothing for a read-only viewer.
    pub(super) fn action(&self, to: &str, fields: &[(&str, &str)], label: &str) -> Markup {
        self.action_with(to, fields, None, label)
    }

    /// The same form with one text field the viewer fills in: its name and placeholder.
    pub(super) fn action_with(
        &self,
        to: &str,
        fields: &[(&str, &str)],
        input: Option<(&str, &str)>,
        label: &str,
    ) -> Markup {
        if !self.acts() {
            return html! {};
        }
        html! {
            form.inline method="post" action=(to) {
                input type="hidden" name="csrf" value=(self.csrf);
                @for (name, value) in fields {
                    input type="hidden" name=(name) value=(value);
                }
                @if let Some((name, placeholder)) = input {
                    input type="text" name=(name) placeholder=(placeholder) size="10";
                    " "
                }
                button type="submit" { (label) }
            }
        }
    }
}
