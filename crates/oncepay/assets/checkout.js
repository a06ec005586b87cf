// oncepay hosted checkout: one payment intent per order, one key per intent.
//
// The rules (the design notes' UI patterns):
// - the card goes to the provider, never to oncepay: the provider's card
//   form (its own script, card_<provider>.js, loaded before this one; see
//   "the card form" below) collects it and gives this page the payment
//   method id, which is all oncepay gets;
// - the key is made at the first click and written to sessionStorage
//   (per order) BEFORE the payment request leaves;
// - until a final status, the button stays busy (aria-busy, focusable, its
//   label says what is happening) and clicks, Enter and submits send nothing;
// - a timeout or a lost answer moves to "checking": the status is polled
//   with backoff, and the request is sent again with the SAME key when the
//   server has no record of it; a reload with a stored key does the same;
// - a payment waiting for the customer's bank (next_action) sends them
//   there; back on the page it says "Confirming with your bank…" and polls,
//   never offering to pay again while the outcome is unknown;
// - succeeded shows a receipt, no Pay button, forgets the key, and returns
//   to the shop's success URL if it gave one;
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
  var T = {};
  try { T = JSON.parse(form.dataset.text || "{}"); } catch (e) { T = {}; }
  var lang = form.dataset.lang || "en";
  var button = document.getElementById("pay");
  var status = document.getElementById("status");
  var receipt = document.getElementById("receipt");
  var bank = document.getElementById("bank");
  var token = form.dataset.token;
  var base = "/checkout/" + encodeURIComponent(token);
  var storageKey = "oncepay-checkout:" + form.dataset.order;
  var successUrl = form.dataset.successUrl || "";
  var tokenInput = document.getElementById("payment_method");
  var testToken = document.getElementById("test-token");
  // ---- the card form: the provider's script set window.oncepayCard to a
  // function that takes what this page shares and returns
  // {fields, check(), token(checked)} (null where its fields are not here).
  // check() reads the fields: null, with their errors shown, if one is
  // wrong; token() sends the card to the provider and resolves to the
  // payment method id, or rejects with an Error whose message is shown.
  // The page says whether it has a card form, so a card script that did
  // not load is never taken for "no card form"; one that fails leaves the
  // rest of the page (a stored intent's outcome above all) working.
  var hasCardForm = !!form.dataset.card && form.dataset.card !== "none";
  var card = null;
  if (hasCardForm && typeof window.oncepayCard === "function") {
    try {
      card = window.oncepayCard({ form: form, T: T, lang: lang, fieldError: fieldError, timed: timed });
    } catch (e) { card = null; }
  }
  var inputs = ((card && card.fields) || []).concat([tokenInput]).filter(Boolean);
  var busy = false;

  // Amounts in the customer's language and the order's currency.
  Array.prototype.forEach.call(document.querySelectorAll("[data-minor]"), function (el) {
    try {
      var exponent = parseInt(el.dataset.exponent, 10) || 0;
      var value = parseInt(el.dataset.minor, 10) / Math.pow(10, exponent);
      el.textContent = new Intl.NumberFormat(lang, {
        style: "currency", currency: el.dataset.currency,
        minimumFractionDigits: exponent, maximumFractionDigits: exponent
      }).format(value);
    } catch (e) { /* the server's rendering stays */ }
  });
  var payLabel = button.textContent;

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
    inputs.forEach(function (i) { i.readOnly = true; });
  }

  function setIdle() {
    busy = false;
    button.removeAttribute("aria-busy");
    button.removeAttribute("aria-disabled");
    button.classList.remove("busy");
    button.textContent = payLabel;
    inputs.forEach(function (i) { i.readOnly = false; });
  }

  // A field's error, tied to it (aria-describedby names the message).
  function fieldError(input, text) {
    var message = document.getElementById(input.id + "-error");
    if (text) {
      input.setAttribute("aria-invalid", "true");
      if (message) { message.textContent = text; message.hidden = false; }
    } else {
      input.removeAttribute("aria-invalid");
      if (message) { message.textContent = ""; message.hidden = true; }
    }
  }
  function clearErrors() { inputs.forEach(function (i) { fieldError(i, ""); }); }

  function hideBank() { if (bank) bank.hidden = true; }

  function succeeded(payment) {
    forget();
    busy = true;
    hideBank();
    form.hidden = true;
    receipt.hidden = false;
    var id = (payment && payment.id) || form.dataset.paidBy;
    if (id) document.getElementById("receipt-id").textContent = id;
    var verb = document.querySelector("h1 .verb");
    // A page that authorizes only: the card is held, not charged.
    var held = (payment && payment.status === "requires_capture") ||
      form.dataset.initial === "authorized";
    var said = held ? T.authorized : T.succeeded;
    if (verb) verb.textContent = (held ? T.authorized_label : T.paid_label) || "Paid";
    show("succeeded", said || "Payment succeeded.");
    if (successUrl && payment) {
      show("succeeded", (said || "") + " " + (T.returning || ""));
      window.setTimeout(function () { window.location.assign(successUrl); }, 800);
    }
  }

  function failed(payment) {
    forget();
    hideBank();
    setIdle();
    var reason = (payment && (payment.failure_message || payment.failure_code)) || T.declined;
    show("failed", (T.failed || "Payment failed:") + " " + reason + " " + (T.try_again || ""));
    (inputs[0] || button).focus();
  }

  function checking() {
    setBusy(T.checking_busy || "Checking payment status…");
    show("checking", T.checking || "Checking the payment status. Please do not pay again.");
  }

  // The payment waits for the customer's bank: say so, keep a way back to
  // the bank's page, never offer to pay again.
  function atBank(url) {
    setBusy(T.bank_busy || "Confirming with your bank…");
    show("authenticating", T.bank || "Confirming with your bank… Please do not pay again.");
    if (bank && url) {
      document.getElementById("continue").href = url;
      bank.hidden = false;
    }
  }

  // Final: nothing more to do on this page, and nothing more is sent.
  function ended(state, text) {
    forget();
    busy = true;
    hideBank();
    form.hidden = true;
    show(state, text);
  }
  function closed() { ended("closed", T.closed || "This order can no longer be paid."); }
  function expired() { ended("expired", T.expired || "This checkout link is no longer valid."); }

  // Final for this visit: the outcome is still unknown after every poll.
  // The key stays stored, so a reload asks again (never pays again).
  function unknown() {
    setBusy(T.unknown_busy || "Payment status unknown");
    show("unknown", T.unknown || "We could not confirm the payment yet. Do not pay again.");
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
    options.cache = "no-store";
    return window.fetch(url, options).finally(function () { window.clearTimeout(timer); });
  }

  // Sends the customer to their bank; they come back to this page, which
  // finds the intent stored and polls it.
  function toBank(intent, url) {
    intent.bank = url;
    remember(intent);
    atBank(url);
    window.location.assign(url);
  }

  // Sends the intent's request: a final answer ends it; anything else
  // (timeout, lost answer, 5xx, in flight, not payable) asks the status.
  function send(intent) {
    intent.sent = (intent.sent || 0) + 1;
    remember(intent);
    return timed(base + "/payments", {
      method: "POST",
      credentials: "same-origin",
      headers: { "Content-Type": "application/json", "Idempotency-Key": intent.key },
      body: JSON.stringify({ payment_method: intent.method })
    }, 8000).then(function (r) {
      return r.json().catch(function () { return {}; }).then(function (body) {
        if (r.status === 201 || r.status === 202) {
          if (body.status === "succeeded" || body.status === "requires_capture") return succeeded(body);
          if (body.status === "failed") return failed(body);
          if (body.next_action && body.next_action.url) return toBank(intent, body.next_action.url);
          return poll(intent, POLL_FIRST_MS);
        }
        if (r.status === 410 || r.status === 404) return expired();
        if (r.status === 409 && body.code === "idempotency_key_reused") {
          return failed({ failure_message: T.not_sent_again });
        }
        // order_not_payable: paid by another tab, or closed; the status says which.
        if (r.status === 409 || r.status === 429 || r.status >= 500) {
          return poll(intent, retryAfter(r, POLL_FIRST_MS));
        }
        failed({ failure_message: body.detail || T.could_not_pay });
      });
    }, function () { return poll(intent, POLL_FIRST_MS); });
  }

  // Asks the status with backoff until the outcome is known, sending the
  // same request again (same key) while the server has no record of it.
  function poll(intent, firstPause) {
    if (intent.bank) atBank(intent.bank); else checking();
    var pause = POLL_FIRST_MS;
    var rounds = 0;
    function again(ms) {
      rounds += 1;
      if (rounds > POLL_ROUNDS) return unknown();
      return sleep(ms).then(ask);
    }
    function ask() {
      return timed(base + "/status?key=" + encodeURIComponent(intent.key), { method: "GET", credentials: "same-origin" }, 8000)
        .then(function (r) {
          if (r.status === 404 || r.status === 410) return { expired: true };
          if (!r.ok) return { wait: retryAfter(r, 0) };
          return r.json().catch(function () { return {}; });
        }, function () { return {}; })
        .then(function (s) {
          if (s.expired) return expired();
          if (s.order_status) {
            if (s.attempt && (s.attempt.status === "succeeded" || s.attempt.status === "requires_capture")) return succeeded(s.attempt);
            if (s.order_status === "paid" || s.order_status === "authorized") return succeeded(s.latest);
            if (s.attempt && s.attempt.status === "failed") return failed(s.attempt);
            if (s.order_status !== "awaiting_payment") return closed();
            var waiting = s.attempt && s.attempt.next_action && s.attempt.next_action.url;
            if (waiting) {
              // Known: it waits for the customer. Not "unknown", however long.
              intent.bank = waiting;
              remember(intent);
              atBank(waiting);
              pause = Math.min(pause * 2, POLL_MAX_MS);
              return sleep(pause).then(ask);
            }
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

  function usesTestToken() {
    return tokenInput && (!hasCardForm || (testToken && testToken.open));
  }

  function pay(method) {
    var intent = { key: newKey(), method: method };
    remember(intent);             // before anything leaves
    setBusy(T.processing_busy || "Processing payment…");
    show("processing", T.processing || "Processing the payment…");
    send(intent);
  }

  function start(event) {
    if (event) event.preventDefault();
    if (busy) return;
    clearErrors();
    if (usesTestToken()) {
      var method = tokenInput.value.trim();
      if (!method) { fieldError(tokenInput, T.err_token); tokenInput.focus(); return; }
      return pay(method);
    }
    if (!card) {
      if (hasCardForm) show("failed", T.err_card_form);
      return;
    }
    var checked = card.check();
    if (!checked) return;
    setBusy(T.processing_busy || "Processing payment…");
    show("processing", T.processing || "Processing the payment…");
    card.token(checked).then(pay, function (e) {
      setIdle();
      show("failed", (e && e.message) || T.err_tokenize);
    });
  }

  form.addEventListener("submit", start);
  button.addEventListener("click", function (event) {
    if (busy) { event.preventDefault(); }
  });

  if (form.dataset.initial === "succeeded" || form.dataset.initial === "authorized") {
    // Paid: by this tab's own intent (back from the bank, a reload) it is
    // this visit's success, and the shop's success URL follows.
    var mine = saved();
    succeeded(mine && mine.key ? { id: form.dataset.paidBy } : null);
    return;
  }
  if (form.dataset.initial === "closed") {
    closed();
    return;
  }
  var pending = saved();
  if (pending && pending.key) {
    // The lone test field shows what the stored intent pays, as it did
    // before the reload.
    if (tokenInput && !hasCardForm && pending.method) tokenInput.value = pending.method;
    poll(pending);
  }
})();
