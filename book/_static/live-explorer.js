// The static site's explorers (pylib.viz.live): each .pb-live box holds a plain HTML form, the first state's tables
// and a zip of pylib's torch-free modules. On the first change of a control this script loads Pyodide (vendored into
// _static/vendor/pyodide by tools/site/vendor.py: no other host), unpacks the zip and from then on asks pylib itself
// (pylib.viz.live.call) for the HTML of the form's state. No formula lives here: the numbers are pylib's.
(function () {
  "use strict";
  if (window.pbLive) return;
  var base = document.currentScript.src.replace(/[^/]*$/, ""); // the site's _static/ folder
  var FOLDER = "/home/pyodide/pb-live"; // where the bundle is unpacked inside Pyodide (on sys.path)
  var runtime = null; // one Pyodide for the page, started on first use

  function start(box, lang) {
    if (runtime) return runtime;
    var zip = box.querySelector("script.pb-live-bundle").textContent.trim();
    runtime = import(base + "vendor/pyodide/pyodide.mjs")
      .then(function (mod) {
        return mod.loadPyodide({ indexURL: base + "vendor/pyodide/" });
      })
      .then(function (py) {
        var bytes = Uint8Array.from(atob(zip), function (c) {
          return c.charCodeAt(0);
        });
        py.unpackArchive(bytes, "zip", { extractDir: FOLDER });
        py.runPython(
          "import sys\nsys.path.insert(0, " + JSON.stringify(FOLDER) + ")\n" +
            "from pylib.viz import live\nlive.start(" + JSON.stringify(FOLDER) + ", " + JSON.stringify(lang) + ")"
        );
        return py;
      });
    return runtime;
  }

  // The form's state: every control by name, with its value's type (select options hold JSON values).
  function state(form) {
    var out = {};
    Array.prototype.forEach.call(form.elements, function (el) {
      if (!el.name) return;
      if (el.type === "checkbox") out[el.name] = el.checked;
      else if (el.type === "number") out[el.name] = el.value === "" ? NaN : Number(el.value);
      else out[el.name] = JSON.parse(el.value);
    });
    return out;
  }

  function setControl(form, name, value) {
    var el = form.elements[name];
    if (!el) return;
    if (el.type === "checkbox") el.checked = !!value;
    else if (el.type === "number") el.value = String(value);
    else el.value = JSON.stringify(value);
  }

  function attach(box) {
    var data = JSON.parse(box.querySelector("script.pb-live-data").textContent);
    var form = box.querySelector("form");
    var out = box.querySelector(".pb-live-out");
    var status = box.querySelector(".pb-live-status");
    var asked = 0; // the latest request wins: an older answer arriving late is dropped

    function say(text) {
      status.textContent = text;
    }

    function compute() {
      var s = state(form);
      var bad = Object.keys(s).filter(function (k) {
        return typeof s[k] === "number" && !Number.isInteger(s[k]);
      });
      if (bad.length) {
        say(data.messages.failed.replace("{error}", bad.join(", ") + ": ?"));
        return;
      }
      var ticket = ++asked;
      box.dataset.state = "busy";
      out.classList.add("pb-live-busy");
      say(runtime ? data.messages.computing : data.messages.loading);
      start(box, data.language)
        .then(function (py) {
          say(data.messages.computing);
          // let the browser paint the message before Python holds the thread
          return new Promise(function (resolve) {
            setTimeout(function () {
              resolve(py);
            }, 20);
          });
        })
        .then(function (py) {
          if (ticket !== asked) return;
          var call = py.globals.get("live").call;
          var html = call(data.kind, JSON.stringify(s));
          call.destroy();
          out.innerHTML = html;
          say(data.messages.ready);
          box.dataset.state = "ready";
          box.dataset.computed = String(Number(box.dataset.computed || 0) + 1);
          out.classList.remove("pb-live-busy");
        })
        .catch(function (err) {
          if (ticket !== asked) return;
          say(data.messages.failed.replace("{error}", String((err && err.message) || err).split("\n").pop()));
          box.dataset.state = "failed";
          out.classList.remove("pb-live-busy");
        });
    }

    form.addEventListener("change", function (event) {
      if (event.target.name === "preset") {
        var values = data.presets[JSON.parse(event.target.value)];
        Object.keys(values).forEach(function (k) {
          setControl(form, k, values[k]);
        });
      }
      compute();
    });
    box.dataset.state = "static";
  }

  window.pbLive = { attach: attach, start: start };
  function scan() {
    document.querySelectorAll(".pb-live").forEach(function (box) {
      if (!box.dataset.state) attach(box);
    });
  }
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", scan);
  else scan();
})();
