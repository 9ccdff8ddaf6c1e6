// Loaded on pages with saved widget state, after require.js and before the widget manager (nb_ipywidgets_js in
// _config.yml); never in JupyterLab, so everything here is about the static site.
(function () {
  // The widget manager finds its CSS's font files beside the AMD module that defines it; without a path for that
  // module, require.js would resolve it next to the page. content_root is the site root relative to this page.
  var root = document.documentElement.dataset.content_root || "";
  window.requirejs.config({
    // The bundled controls and base modules find their Font Awesome files (a Tab's or an Accordion's icons) beside
    // their own module URL: map them into the same folder, or the browser looks for the fonts beside the page.
    paths: {
      "@jupyter-widgets/html-manager/dist": root + "_static/vendor/html-manager",
      "@jupyter-widgets/html-manager": root + "_static/vendor/html-manager/html-manager",
      "@jupyter-widgets/controls": root + "_static/vendor/html-manager/controls",
      "@jupyter-widgets/controls7": root + "_static/vendor/html-manager/controls7",
      "@jupyter-widgets/base": root + "_static/vendor/html-manager/base",
      "@jupyter-widgets/base7": root + "_static/vendor/html-manager/base7",
      "@jupyter-widgets/output": root + "_static/vendor/html-manager/output",
    },
  });
  // ipywidgets' controls typeset a widget's description with MathJax 2's MathJax.Hub.Queue whenever MathJax is on
  // the page; the site loads MathJax 3, whose API is typesetPromise. Bridge the one call they make.
  function bridge() {
    var mj = window.MathJax;
    if (mj && !mj.Hub && mj.typesetPromise) {
      mj.Hub = {
        Queue: function (job) {
          var element = job[2];
          return mj.startup.promise.then(function () {
            return mj.typesetPromise([element]);
          });
        },
      };
    }
  }
  // MathJax is loaded deferred: it is there by the time the load event fires, which is when the widgets render.
  window.addEventListener("load", bridge);

  // Widgets that need a kernel. A chapter marks the container of controls whose effect is computed in Python
  // (container.add_class("pb-needs-kernel")); on the static page no kernel answers them, so moving one would change
  // the number beside it and nothing else. Each such container gets its controls disabled (and greyed by site.css)
  // and a notice saying how to get them working. The widgets render after the load event and may re-render, so a
  // MutationObserver applies this to whatever appears; applying it twice changes nothing.
  var NEEDS_KERNEL = ".pb-needs-kernel";
  var INTERACTIVE = 'input, select, textarea, button, .noUi-target, .noUi-handle, [contenteditable="true"]';
  // The element of one control widget (a slider with its label and readout, a dropdown, a row of toggle buttons).
  var GROUP = ".widget-toggle-buttons, .widget-radio"; // one control of several buttons
  var CONTROL =
    ".widget-inline-hbox, .widget-button, .widget-toggle-button, .widget-checkbox, .widget-play, .jupyter-button";

  // The notice in the page's language: the Chinese edition's pages have <html lang="zh...">; English otherwise.
  var ZH = /^zh/i.test(document.documentElement.lang || "");
  var TEXT = ZH
    ? {
        title: "这些控件需要运行中的内核：",
        launch: "请用启动按钮（页面顶部的火箭）打开本页，或在本地运行。",
        local: "请在本地以 notebook 的形式运行本章。",
        howTo: "如何运行。",
        saved: "这里的探索器显示的是构建本页时保存的状态。",
      }
    : {
        title: "These controls need a running kernel: ",
        launch: "open this page with the launch button (the rocket at the top of the page) or run it locally.",
        local: "run this chapter locally, as a notebook.",
        howTo: "How to run it.",
        saved: "What the explorer shows here is the state saved when the page was built.",
      };

  function notice() {
    var box = document.createElement("div");
    box.className = "pb-kernel-notice";
    box.setAttribute("role", "note");
    var launch = document.querySelector('a[href*="/hub/user-redirect/"]');
    var local = document.getElementById("run-this-chapter");
    var how = launch ? TEXT.launch : TEXT.local;
    box.appendChild(document.createElement("strong")).textContent = TEXT.title;
    box.appendChild(document.createTextNode(how + " "));
    if (local) {
      var link = box.appendChild(document.createElement("a"));
      link.href = "#run-this-chapter";
      link.textContent = TEXT.howTo;
      box.appendChild(document.createTextNode(" "));
    }
    box.appendChild(document.createTextNode(TEXT.saved));
    return box;
  }

  function disable(container) {
    if (!container.classList.contains("pb-kernel-off")) container.classList.add("pb-kernel-off");
    if (!container.querySelector(":scope > .pb-kernel-notice")) {
      container.insertBefore(notice(), container.firstChild);
    }
    container.querySelectorAll(INTERACTIVE).forEach(function (el) {
      var control = el.closest(GROUP) || el.closest(CONTROL) || el;
      if (!control.hasAttribute("data-pb-kernel-off")) {
        control.setAttribute("data-pb-kernel-off", "");
        control.setAttribute("aria-disabled", "true");
        control.title = "Needs a running kernel";
      }
      if (!control.inert) control.inert = true; // no focus, no click, no drag, no keyboard
      if ("disabled" in el && !el.disabled) el.disabled = true; // form elements: disabled for assistive tech too
      if (el.classList.contains("noUi-target") && !el.hasAttribute("disabled")) el.setAttribute("disabled", "");
      if (el.classList.contains("noUi-handle") && el.getAttribute("tabindex") !== "-1") {
        el.setAttribute("tabindex", "-1");
      }
      if (el.isContentEditable) el.contentEditable = "false"; // a slider's editable readout
    });
  }

  var pending = false;
  function scan() {
    pending = false;
    document.querySelectorAll(NEEDS_KERNEL).forEach(disable);
  }
  function schedule() {
    if (!pending) {
      pending = true;
      window.requestAnimationFrame(scan);
    }
  }
  function start() {
    new MutationObserver(schedule).observe(document.body, {
      childList: true,
      subtree: true,
      attributes: true,
      attributeFilter: ["disabled", "class", "contenteditable"],
    });
    scan();
  }
  if (document.body) start();
  else document.addEventListener("DOMContentLoaded", start);
})();
