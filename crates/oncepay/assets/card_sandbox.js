// oncepay hosted checkout: the sandbox's card form (data-card="tokenize").
// The page's own fields, formatted as typed and checked here; the card is
// posted from the browser to the provider's tokenization (data-tokenize,
// the sandbox's POST /v1/tokens) and only the token it answers goes to
// oncepay. Loaded before checkout.js, which calls window.oncepayCard (the
// interface is described there).
(function () {
  "use strict";
  window.oncepayCard = function (page) {
    var cardNumber = document.getElementById("card-number");
    var cardExp = document.getElementById("card-exp");
    var cardCvc = document.getElementById("card-cvc");
    if (!cardNumber || !cardExp || !cardCvc) return null;
    var T = page.T;
    var fieldError = page.fieldError;
    var tokenizeUrl = page.form.dataset.tokenize || "";
    var fields = [cardNumber, cardExp, cardCvc];

    function digits(text) { return (text || "").replace(/\D/g, ""); }
    function brandOf(number) {
      if (/^4/.test(number)) return "visa";
      if (/^(5[1-5]|2(2[2-9]|[3-6]|7[01]|720))/.test(number)) return "mastercard";
      if (/^3[47]/.test(number)) return "amex";
      if (/^(6011|65)/.test(number)) return "discover";
      if (/^35(2[89]|[3-8])/.test(number)) return "jcb";
      if (/^62/.test(number)) return "unionpay";
      return "";
    }
    function luhn(number) {
      var sum = 0;
      for (var i = 0; i < number.length; i++) {
        var d = parseInt(number.charAt(number.length - 1 - i), 10);
        if (i % 2 === 1) { d *= 2; if (d > 9) d -= 9; }
        sum += d;
      }
      return number.length >= 12 && number.length <= 19 && sum % 10 === 0;
    }
    function grouped(number) {
      if (brandOf(number) === "amex") {
        return [number.slice(0, 4), number.slice(4, 10), number.slice(10, 15)].filter(Boolean).join(" ");
      }
      return number.replace(/(\d{4})(?=\d)/g, "$1 ");
    }

    var brandLabel = document.createElement("span");
    brandLabel.id = "card-brand";
    brandLabel.className = "brand";
    cardNumber.parentNode.insertBefore(brandLabel, cardNumber.nextSibling);
    cardNumber.addEventListener("input", function () {
      var number = digits(cardNumber.value).slice(0, 19);
      cardNumber.value = grouped(number);
      brandLabel.textContent = brandOf(number);
      cardNumber.dataset.brand = brandOf(number);
    });
    cardExp.addEventListener("input", function () {
      var d = digits(cardExp.value).slice(0, 4);
      cardExp.value = d.length > 2 ? d.slice(0, 2) + "/" + d.slice(2) : d;
    });
    cardCvc.addEventListener("input", function () { cardCvc.value = digits(cardCvc.value).slice(0, 4); });

    // The card's fields, checked; null (with errors shown) if one is wrong.
    function readCard() {
      var number = digits(cardNumber.value);
      var exp = digits(cardExp.value);
      var cvc = digits(cardCvc.value);
      var month = parseInt(exp.slice(0, 2), 10);
      var year = 2000 + parseInt(exp.slice(2, 4), 10);
      var now = new Date();
      var ok = true;
      if (!luhn(number)) { fieldError(cardNumber, T.err_number); ok = false; }
      if (exp.length !== 4 || !(month >= 1 && month <= 12)) {
        fieldError(cardExp, T.err_expiry); ok = false;
      } else if (year < now.getFullYear() || (year === now.getFullYear() && month < now.getMonth() + 1)) {
        fieldError(cardExp, T.err_expired); ok = false;
      }
      if (cvc.length !== (brandOf(number) === "amex" ? 4 : 3)) { fieldError(cardCvc, T.err_cvc); ok = false; }
      if (!ok) {
        var first = fields.filter(function (i) { return i.getAttribute("aria-invalid") === "true"; })[0];
        if (first) first.focus();
        return null;
      }
      return { number: number, month: String(month), year: String(year), cvc: cvc };
    }

    // The card to the provider, the token back; the number never goes to
    // oncepay.
    function tokenize(card) {
      var body = new URLSearchParams();
      body.set("card[number]", card.number);
      body.set("card[exp_month]", card.month);
      body.set("card[exp_year]", card.year);
      body.set("card[cvc]", card.cvc);
      return page.timed(tokenizeUrl, { method: "POST", body: body, credentials: "omit" }, 10000).then(function (r) {
        return r.json().catch(function () { return {}; }).then(function (answer) {
          if (r.ok && answer.id) return answer.id;
          var param = answer.error && answer.error.param;
          var target = param === "card[number]" ? cardNumber
            : (param === "card[cvc]" ? cardCvc : (param ? cardExp : null));
          var message = param === "card[number]" ? T.err_number
            : param === "card[cvc]" ? T.err_cvc
            : (answer.error && answer.error.code === "expired_card") ? T.err_expired
            : param ? T.err_expiry : T.err_tokenize;
          if (target) { fieldError(target, message); target.focus(); }
          throw new Error(message);
        });
      });
    }

    return {
      fields: fields,
      check: readCard,
      token: function (card) {
        return tokenize(card).then(function (tok) {
          cardNumber.value = "";       // the number is not kept on the page
          cardCvc.value = "";
          return tok;
        });
      }
    };
  };
})();
