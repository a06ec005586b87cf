//! The checkout page's words, in the languages of the people this project
//! started from: English, Russian and Chinese. The page's script gets its
//! own strings from the same table (a `data-text` attribute), so both
//! speak one language.

use serde::Serialize;

use crate::provider::card_form::CardWords;

/// A language the page speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lang {
    /// English.
    En,
    /// Russian.
    Ru,
    /// Chinese (simplified).
    Zh,
}

impl Lang {
    /// The `lang` attribute, and the `Intl` locale.
    pub fn tag(self) -> &'static str {
        match self {
            Lang::En => "en",
            Lang::Ru => "ru",
            Lang::Zh => "zh",
        }
    }

    /// The session's language if the merchant chose one, else the first of
    /// the browser's `Accept-Language` the page speaks, else English.
    pub fn choose(session: Option<&str>, accept_language: Option<&str>) -> Lang {
        let of = |tag: &str| match tag.split(['-', '_']).next().map(str::to_ascii_lowercase) {
            Some(l) if l == "ru" => Some(Lang::Ru),
            Some(l) if l == "zh" => Some(Lang::Zh),
            Some(l) if l == "en" => Some(Lang::En),
            _ => None,
        };
        if let Some(lang) = session.and_then(of) {
            return lang;
        }
        let mut ranked: Vec<(f32, Lang)> = accept_language
            .unwrap_or_default()
            .split(',')
            .filter_map(|part| {
                let mut pieces = part.trim().split(';');
                let lang = of(pieces.next()?.trim())?;
                let q = pieces
                    .find_map(|p| p.trim().strip_prefix("q="))
                    .and_then(|q| q.parse::<f32>().ok())
                    .unwrap_or(1.0);
                Some((q, lang))
            })
            .collect();
        ranked.sort_by(|a, b| b.0.total_cmp(&a.0));
        ranked.first().map_or(Lang::En, |r| r.1)
    }

    /// The page's words.
    pub fn text(self) -> &'static Text {
        match self {
            Lang::En => &EN,
            Lang::Ru => &RU,
            Lang::Zh => &ZH,
        }
    }
}

/// Every word the page shows (the script's too); each field is named for
/// where it is shown.
#[allow(missing_docs)]
#[derive(Debug, Serialize)]
pub struct Text {
    pub title: &'static str,
    pub pay: &'static str,
    pub test_mode: &'static str,
    pub order: &'static str,
    pub item: &'static str,
    pub qty: &'static str,
    pub amount: &'static str,
    pub total: &'static str,
    /// The words of the provider's card form; flattened, so the script
    /// finds them beside the others.
    #[serde(flatten)]
    pub card_form: CardWords,
    pub use_test_token: &'static str,
    pub test_token: &'static str,
    pub cancel: &'static str,
    pub ready: &'static str,
    /// Shown on a page that authorizes only (`capture_method: manual`).
    pub authorize_note: &'static str,
    /// The heading's verb once authorized.
    pub authorized_label: &'static str,
    /// The outcome of an authorization: the card is held, not charged.
    pub authorized: &'static str,
    pub received: &'static str,
    pub thank_you: &'static str,
    pub paid_label: &'static str,
    pub payment_ref: &'static str,
    pub processing: &'static str,
    pub processing_busy: &'static str,
    pub checking: &'static str,
    pub checking_busy: &'static str,
    pub bank: &'static str,
    pub bank_busy: &'static str,
    pub continue_at_bank: &'static str,
    pub succeeded: &'static str,
    pub failed: &'static str,
    pub try_again: &'static str,
    pub declined: &'static str,
    pub not_sent_again: &'static str,
    pub could_not_pay: &'static str,
    pub closed: &'static str,
    pub expired: &'static str,
    pub unknown: &'static str,
    pub unknown_busy: &'static str,
    pub returning: &'static str,
    pub err_number: &'static str,
    pub err_expiry: &'static str,
    pub err_expired: &'static str,
    pub err_cvc: &'static str,
    pub err_token: &'static str,
    pub err_tokenize: &'static str,
    /// The provider's card form (its script, or Stripe.js) did not load.
    pub err_card_form: &'static str,
    pub not_found_title: &'static str,
    pub not_found: &'static str,
    pub expired_title: &'static str,
    pub expired_page: &'static str,
}

const EN: Text = Text {
    title: "Checkout",
    pay: "Pay",
    test_mode: "Test mode: no real money moves. Use a test card, such as 4242 4242 4242 4242.",
    order: "Order",
    item: "Item",
    qty: "Qty",
    amount: "Amount",
    total: "Total",
    card_form: CardWords {
        card_number: "Card number",
        card: "Card",
        expiry: "Expiry date",
        expiry_hint: "MM/YY",
        cvc: "Security code (CVC)",
    },
    use_test_token: "Use a test token",
    test_token: "Test token",
    cancel: "Cancel and return to the shop",
    ready: "Ready to pay.",
    authorize_note: "Your card will be authorized now and charged only when the shop completes your order.",
    authorized_label: "Authorized",
    authorized: "Card authorized: you have not been charged yet. The shop charges it when it completes your order.",
    received: "Payment received",
    thank_you: "Thank you. The payment was received.",
    paid_label: "Paid",
    payment_ref: "Payment",
    processing: "Processing the payment…",
    processing_busy: "Processing payment…",
    checking: "Checking the payment status. Please do not pay again.",
    checking_busy: "Checking payment status…",
    bank: "Confirming with your bank… Please do not pay again.",
    bank_busy: "Confirming with your bank…",
    continue_at_bank: "Continue at your bank",
    succeeded: "Payment succeeded.",
    failed: "Payment failed:",
    try_again: "You can try again with another card.",
    declined: "The payment was declined.",
    not_sent_again: "This payment could not be sent again.",
    could_not_pay: "The payment could not be made.",
    closed: "This order can no longer be paid.",
    expired: "This checkout link is no longer valid. Ask the shop for a new one.",
    unknown: "We could not confirm the payment yet. Do not pay again: reload this page in a few minutes to see its outcome.",
    unknown_busy: "Payment status unknown",
    returning: "Returning to the shop…",
    err_number: "Enter a valid card number.",
    err_expiry: "Enter the expiry date as MM/YY.",
    err_expired: "This card has expired.",
    err_cvc: "Enter the 3-digit security code (4 digits for American Express).",
    err_token: "Enter a test token.",
    err_tokenize: "The card could not be checked. Please try again.",
    err_card_form: "The card form could not load. Check your connection and reload the page.",
    not_found_title: "Checkout not found",
    not_found: "This checkout link is not valid. Check the link the shop sent you.",
    expired_title: "Checkout expired",
    expired_page: "This checkout link has expired, and nothing can be paid with it. Ask the shop for a new one.",
};

const RU: Text = Text {
    title: "Оплата",
    pay: "Оплатить",
    test_mode: "Тестовый режим: настоящие деньги не списываются. Используйте тестовую карту, например 4242 4242 4242 4242.",
    order: "Заказ",
    item: "Товар",
    qty: "Кол-во",
    amount: "Сумма",
    total: "Итого",
    card_form: CardWords {
        card_number: "Номер карты",
        card: "Карта",
        expiry: "Срок действия",
        expiry_hint: "ММ/ГГ",
        cvc: "Код безопасности (CVC)",
    },
    use_test_token: "Использовать тестовый токен",
    test_token: "Тестовый токен",
    cancel: "Отменить и вернуться в магазин",
    ready: "Можно оплачивать.",
    authorize_note: "Сумма будет заблокирована на карте сейчас и списана, только когда магазин выполнит заказ.",
    authorized_label: "Заблокировано",
    authorized: "Сумма заблокирована на карте, но ещё не списана. Магазин спишет её, когда выполнит заказ.",
    received: "Оплата получена",
    thank_you: "Спасибо. Оплата получена.",
    paid_label: "Оплачено",
    payment_ref: "Платёж",
    processing: "Проводим оплату…",
    processing_busy: "Проводим оплату…",
    checking: "Проверяем статус оплаты. Пожалуйста, не оплачивайте повторно.",
    checking_busy: "Проверяем статус…",
    bank: "Подтверждаем в вашем банке… Пожалуйста, не оплачивайте повторно.",
    bank_busy: "Подтверждаем в банке…",
    continue_at_bank: "Продолжить в банке",
    succeeded: "Оплата прошла.",
    failed: "Оплата не прошла:",
    try_again: "Можно попробовать другую карту.",
    declined: "Платёж отклонён.",
    not_sent_again: "Этот платёж нельзя отправить повторно.",
    could_not_pay: "Оплатить не удалось.",
    closed: "Этот заказ больше нельзя оплатить.",
    expired: "Эта ссылка на оплату больше не действует. Попросите у магазина новую.",
    unknown: "Мы пока не смогли подтвердить оплату. Не оплачивайте повторно: обновите страницу через несколько минут, чтобы увидеть результат.",
    unknown_busy: "Статус оплаты неизвестен",
    returning: "Возвращаемся в магазин…",
    err_number: "Введите правильный номер карты.",
    err_expiry: "Введите срок действия в виде ММ/ГГ.",
    err_expired: "Срок действия карты истёк.",
    err_cvc: "Введите трёхзначный код безопасности (четыре цифры для American Express).",
    err_token: "Введите тестовый токен.",
    err_tokenize: "Не удалось проверить карту. Попробуйте ещё раз.",
    err_card_form: "Форма карты не загрузилась. Проверьте соединение и обновите страницу.",
    not_found_title: "Страница оплаты не найдена",
    not_found: "Эта ссылка на оплату неверна. Проверьте ссылку, которую прислал магазин.",
    expired_title: "Ссылка на оплату устарела",
    expired_page: "Срок действия этой ссылки истёк, по ней ничего нельзя оплатить. Попросите у магазина новую.",
};

const ZH: Text = Text {
    title: "结账",
    pay: "支付",
    test_mode: "测试模式：不会扣除真实款项。请使用测试卡，例如 4242 4242 4242 4242。",
    order: "订单",
    item: "商品",
    qty: "数量",
    amount: "金额",
    total: "合计",
    card_form: CardWords {
        card_number: "卡号",
        card: "银行卡",
        expiry: "有效期",
        expiry_hint: "月/年",
        cvc: "安全码 (CVC)",
    },
    use_test_token: "使用测试令牌",
    test_token: "测试令牌",
    cancel: "取消并返回商店",
    ready: "可以支付。",
    authorize_note: "您的银行卡现在只会被预授权，商店完成订单时才会扣款。",
    authorized_label: "已预授权",
    authorized: "银行卡已预授权，尚未扣款。商店完成订单时才会扣款。",
    received: "已收到付款",
    thank_you: "谢谢，已收到您的付款。",
    paid_label: "已支付",
    payment_ref: "支付编号",
    processing: "正在处理付款…",
    processing_busy: "正在处理付款…",
    checking: "正在查询付款状态，请勿重复支付。",
    checking_busy: "正在查询状态…",
    bank: "正在与您的银行确认…请勿重复支付。",
    bank_busy: "正在与银行确认…",
    continue_at_bank: "前往银行继续",
    succeeded: "支付成功。",
    failed: "支付失败：",
    try_again: "您可以换一张卡再试。",
    declined: "付款被拒绝。",
    not_sent_again: "此付款无法再次发送。",
    could_not_pay: "无法完成付款。",
    closed: "此订单已无法支付。",
    expired: "此结账链接已失效，请向商店索取新链接。",
    unknown: "暂时无法确认付款结果。请勿重复支付：几分钟后刷新此页面查看结果。",
    unknown_busy: "付款状态未知",
    returning: "正在返回商店…",
    err_number: "请输入有效的卡号。",
    err_expiry: "请按 月/年 (MM/YY) 格式输入有效期。",
    err_expired: "此卡已过期。",
    err_cvc: "请输入3位安全码（American Express 为4位）。",
    err_token: "请输入测试令牌。",
    err_tokenize: "无法验证该卡，请重试。",
    err_card_form: "银行卡表单未能加载。请检查网络连接后刷新页面。",
    not_found_title: "未找到结账页面",
    not_found: "此结账链接无效，请检查商店发送给您的链接。",
    expired_title: "结账链接已过期",
    expired_page: "此结账链接已过期，无法用于支付。请向商店索取新链接。",
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_language_is_the_sessions_else_the_browsers_best() {
        assert_eq!(Lang::choose(Some("ru"), Some("en")), Lang::Ru);
        assert_eq!(
            Lang::choose(None, Some("de-DE,zh-CN;q=0.8,en;q=0.5")),
            Lang::Zh
        );
        assert_eq!(Lang::choose(None, Some("en;q=0.3, ru;q=0.9")), Lang::Ru);
        assert_eq!(Lang::choose(None, Some("fr")), Lang::En);
        assert_eq!(Lang::choose(None, None), Lang::En);
    }

    #[test]
    fn the_scripts_get_the_card_forms_words_among_the_others() {
        let text = serde_json::to_string(Lang::En.text()).expect("json");
        assert!(
            text.contains(
                "\"total\":\"Total\",\"card_number\":\"Card number\",\"card\":\"Card\",\
                 \"expiry\":\"Expiry date\",\"expiry_hint\":\"MM/YY\",\"cvc\":\"Security code (CVC)\",\
                 \"use_test_token\""
            ),
            "{text}"
        );
    }
}
