// oncepay hosted checkout: one payment intent per order, one key per intent.
//
// The rules (the design notes' UI patterns):
// - the key is made at the first click and written to sessionStorage
//   (per order) BEFORE the request leaves;
// - until a final status, the button stays busy (aria-busy, focusable, its
//   label says what is happening) and clicks, Enter and submits send nothing;
// - a timeout or a lost answer moves to "checking": the status is polled
//   with backoff, and the request is sent again with the SAME key when the
//   server has no record of it; a reload with a stored key does the same;
// - succeeded shows a receipt, no Pay button, and forgets the key;
// - failed shows the reason and allows a new attempt with a NEW key;
// - an order that can no longer be paid (cancelled, refunded) ends on
//   "closed", and a link that no longer works on "expired".
// Every way ends: a request is sent again at most RESENDS times per intent
// (counted in sessionStorage, so a reload does not reset it), polls back
// off to POLL_MAX_MS and stop after POLL_ROUNDS with an honest "unknown"
// ("do not pay again; reload later"), and a 429's Retry-After is obeyed.
// The server decides anyway: one order, one live attempt.
(function () {
  "use strict";
  var form = document.getElementById("checkout");
  if (!form) return;
  var input = document.getElementById("payment_method");
  var button = document.getElementById("pay");
  var status = document.getElementById("status");
  var receipt = document.getElementById("receipt");
  var token = form.dataset.token;
  var base = "/checkout/" + encodeURIComponent(token);
  var storageKey = "oncepay-checkout:" + form.dataset.order;
  var payLabel = button.textContent;
  var busy = false;

  function saved() {
    try { return JSON.parse(window.sessionStorage.getItem(storageKey) || "null"); }
    catch (e) { return null; }
  }
  function remember(intent) { window.sessionStorage.setItem(storageKey, JSON.stringify(intent)); }
  function forget() { window.sessionStorage.removeItem(storageKey); }

  function newKey() {
    if (window.crypto && window.crypto.randomUUID) return window.crypto.randomUUID();
    var bytes = new Uint8Array(16);
    window.crypto.getRandomValues(bytes);
    return Array.prototype.map.call(bytes, function (b) { return ("0" + b.toString(16)).slice(-2); }).join("");
  }

  function show(state, text) {
    status.dataset.status = state;
    status.textContent = text;
    document.body.dataset.status = state;
  }

  function setBusy(label) {
    busy = true;
    button.setAttribute("aria-busy", "true");
    button.setAttribute("aria-disabled", "true");
    button.classList.add("busy");
    button.textContent = label;
    input.readOnly = true;
  }

  function setIdle() {
    busy = false;
    button.removeAttribute("aria-busy");
    button.removeAttribute("aria-disabled");
    button.classList.remove("busy");
    button.textContent = payLabel;
    input.readOnly = false;
  }

  function succeeded(payment) {
    forget();
    busy = true;
    form.hidden = true;
    receipt.hidden = false;
    if (payment && payment.id) document.getElementById("receipt-id").textContent = payment.id;
    var title = document.querySelector("h1");
    if (title && title.firstChild) title.firstChild.textContent = "Paid ";
    show("succeeded", "Payment succeeded. You can close this page.");
  }

  function failed(payment) {
    forget();
    setIdle();
    var reason = (payment && (payment.failure_message || payment.failure_code)) || "The payment was declined.";
    show("failed", "Payment failed: " + reason + " You can try again with another card.");
    input.focus();
  }

  function checking() {
    setBusy("Checking payment status…");
    show("checking", "Checking the payment status. Please do not pay again.");
  }

  // Final: nothing more to do on this page, and nothing more is sent.
  function ended(state, text) {
    forget();
    busy = true;
    form.hidden = true;
    show(state, text);
  }
  function closed() { ended("closed", "This order can no longer be paid."); }
  function expired() { ended("expired", "This checkout link is no longer valid. Ask the shop for a new one."); }

  // Final for this visit: the outcome is still unknown after every poll.
  // The key stays stored, so a reload asks again (never pays again).
  function unknown() {
    setBusy("Payment status unknown");
    show("unknown", "We could not confirm the payment yet. Do not pay again: reload this page in a few minutes to see its outcome.");
  }

  var RESENDS = 3;
  var POLL_FIRST_MS = 500;
  var POLL_MAX_MS = 8000;
  var POLL_ROUNDS = 20;

  function sleep(ms) { return new Promise(function (r) { window.setTimeout(r, ms); }); }

  // The pause a 429 or 503 asks for (Retry-After, in seconds), bounded.
  function retryAfter(r, fallback) {
    var seconds = parseInt(r.headers.get("Retry-After") || "", 10);
    if (!(seconds > 0)) return fallback;
    return Math.min(Math.max(seconds * 1000, POLL_FIRST_MS), 60000);
  }

  function timed(url, options, ms) {
    var controller = new AbortController();
    var timer = window.setTimeout(function () { controller.abort(); }, ms);
    options.signal = controller.signal;
    options.credentials = "same-origin";
    options.cache = "no-store";
    return window.fetch(url, options).finally(function () { window.clearTimeout(timer); });
  }

  // Sends the intent's request: a final answer ends it; anything else
  // (timeout, lost answer, 5xx, in flight, not payable) asks the status.
  function send(intent) {
    intent.sent = (intent.sent || 0) + 1;
    remember(intent);
    return timed(base + "/payments", {
      method: "POST",
      headers: { "Content-Type": "application/json", "Idempotency-Key": intent.key },
      body: JSON.stringify({ payment_method: intent.method })
    }, 8000).then(function (r) {
      return r.json().catch(function () { return {}; }).then(function (body) {
        if (r.status === 201 || r.status === 202) {
          if (body.status === "succeeded") return succeeded(body);
          if (body.status === "failed") return failed(body);
          return poll(intent, POLL_FIRST_MS);
        }
        if (r.status === 410 || r.status === 404) return expired();
        if (r.status === 409 && body.code === "idempotency_key_reused") {
          return failed({ failure_message: "This payment could not be sent again." });
        }
        // order_not_payable: paid by another tab, or closed; the status says which.
        if (r.status === 409 || r.status === 429 || r.status >= 500) {
          return poll(intent, retryAfter(r, POLL_FIRST_MS));
        }
        failed({ failure_message: body.detail || "The payment could not be made." });
      });
    }, function () { return poll(intent, POLL_FIRST_MS); });
  }

  // Asks the status with backoff until the outcome is known, sending the
  // same request again (same key) while the server has no record of it.
  function poll(intent, firstPause) {
    checking();
    var pause = POLL_FIRST_MS;
    var rounds = 0;
    function again(ms) {
      rounds += 1;
      if (rounds > POLL_ROUNDS) return unknown();
      return sleep(ms).then(ask);
    }
    function ask() {
      return timed(base + "/status?key=" + encodeURIComponent(intent.key), { method: "GET" }, 8000)
        .then(function (r) {
          if (r.status === 404 || r.status === 410) return { expired: true };
          if (!r.ok) return { wait: retryAfter(r, 0) };
          return r.json().catch(function () { return {}; });
        }, function () { return {}; })
        .then(function (s) {
          if (s.expired) return expired();
          if (s.order_status) {
            if (s.attempt && s.attempt.status === "succeeded") return succeeded(s.attempt);
            if (s.order_status === "paid") return succeeded(s.latest);
            if (s.attempt && s.attempt.status === "failed") return failed(s.attempt);
            if (s.order_status !== "awaiting_payment") return closed();
            var noRecord = !s.attempt && !(s.latest && s.latest.status === "pending");
            if (noRecord && (intent.sent || 0) < RESENDS) {
              return sleep(pause).then(function () { return send(intent); });
            }
          }
          var wait = Math.max(s.wait || 0, pause);
          pause = Math.min(pause * 2, POLL_MAX_MS);
          return again(wait);
        });
    }
    return firstPause ? sleep(firstPause).then(ask) : ask();
  }

  function start(event) {
    if (event) event.preventDefault();
    if (busy) return;
    var method = input.value.trim();
    if (!method) { show("failed", "Enter a card token."); input.focus(); return; }
    var intent = { key: newKey(), method: method };
    remember(intent);             // before anything leaves
    setBusy("Processing payment…");
    show("processing", "Processing the payment…");
    send(intent);
  }

  form.addEventListener("submit", start);
  button.addEventListener("click", function (event) {
    if (busy) { event.preventDefault(); }
  });

  if (form.dataset.initial === "succeeded") {
    succeeded(null);
    return;
  }
  if (form.dataset.initial === "closed") {
    closed();
    return;
  }
  var pending = saved();
  if (pending && pending.key) {
    input.value = pending.method;
    poll(pending);
  }
})();
