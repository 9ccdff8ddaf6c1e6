"""Makes the book's table cells and figure alt texts translatable (loaded through _config.yml's
`sphinx: local_extensions`, for every build: the English one, the gettext extraction and the Chinese one).

Sphinx's gettext machinery (`sphinx.util.nodes.extract_messages`, used both to write the .pot catalogs and, in the
Locale transform, to put the translations in) takes a text node only if it knows where it came from (`node.source`)
and what its source text was (`node.rawsource`). MyST's table cells have neither, so a Markdown table in a chapter
(the glossary's three tables, every hand-written comparison table) never reached the catalogs and stayed English in
the Chinese edition. `mark_table_cells` gives each cell paragraph the chapter as its source and its text as its raw
source, before the Locale transform runs (priority 20; this runs at 15). The msgid of a cell is its plain text, so a
cell's inline markup (`code`, $math$) is written back by the translator in the msgstr, which MyST parses as usual.

A translated paragraph is parsed by Sphinx as a small document of its own, which has none of the notebook's
state; a {glue:text} role in it found no glue data ("No key ... found in glue data for this document").
`_patch_glue_lookup` notes the chapter's notebook renderer when its English glue roles are read (myst-nb keeps it
on the document only while parsing) and lends it to those small documents, so a glued number reads the same in
both editions.

A glued figure's caption (`{glue:figure}`) never reached the catalogs: the gettext builder does not execute the
chapters, so it has no glue data, and myst-nb's directive then returns only its warning, caption and all. In that
build `_patch_glue_figure` lets the directive return the figure with its caption and no output, which the extraction
reads like any other caption; in the executed builds the directive runs as before, and the Locale transform puts the
caption's translation in.

Figure alt texts are attributes, not text nodes, so Sphinx never extracts them. `AltTexts` puts each one in the
catalog as a message of its own (gettext builder) and replaces it with its translation (any other builder): the
Chinese edition's figures are described in Chinese.

The part titles of _toc.yml reach the root page's catalog (the gettext builder extracts the toctree captions that
sphinx-external-toc inserts there), but its `InsertToctrees` transform (priority 100) runs after the Locale one, so
the sidebar kept them English. `TranslateToctreeCaptions` (101) puts the root catalog's translations in. myst-nb's
prompts for a folded cell ("Show code cell source") are the config values `nb_code_prompt_show` / `_hide`, whose
`{type}` myst-nb fills with an English word (source, output, outputs, content); `TranslatePromptTypes` (after
myst-nb's HideInputCells, 199) replaces that word with the config value `book_code_prompt_types` (the Chinese build
sets both, tools/i18n/build_zh.py).
"""

from __future__ import annotations

import re
from pathlib import Path

from docutils import nodes
from sphinx import addnodes
from sphinx.locale import init as init_locale
from sphinx.transforms import SphinxTransform
from sphinx.transforms.post_transforms import SphinxPostTransform
from sphinx.util.i18n import docname_to_domain


class MarkTableCells(SphinxTransform):
    default_priority = 15  # before sphinx.transforms.i18n.Locale (20)

    def apply(self, **kwargs) -> None:
        source = self.document.get("source", "")
        for entry in self.document.findall(nodes.entry):
            for paragraph in entry.findall(nodes.paragraph):
                if not paragraph.source:
                    paragraph.source = source
                if paragraph.line is None:
                    paragraph.line = 0
                if not paragraph.rawsource:
                    paragraph.rawsource = paragraph.astext()


_RENDERER = "parallelism_book_nb_renderer"


def _glue_data_from_the_chapter(original):
    from myst_nb.ext.glue.utils import RetrievalError

    def retrieve(document, key):
        env = getattr(document.settings, "env", None)
        if env is not None and "nb_renderer" in document and "<translated>" not in document.get("source", ""):
            env.temp_data[_RENDERER] = document["nb_renderer"]  # the chapter's own, while its English is parsed
        try:
            return original(document, key)
        except RetrievalError:
            chapter = env.temp_data.get(_RENDERER) if env is not None else None
            if chapter is None or document.get("nb_renderer") is chapter:
                raise
            own = document.get("nb_renderer")
            document["nb_renderer"] = chapter  # the small document of a translated paragraph: read the chapter's
            try:
                return original(document, key)
            finally:
                if own is None:
                    del document["nb_renderer"]
                else:
                    document["nb_renderer"] = own

    return retrieve


def _patch_glue_lookup() -> None:
    from myst_nb.ext.glue import directives, roles, utils

    for module in (utils, roles, directives):
        if hasattr(module, "retrieve_glue_data") and not hasattr(module.retrieve_glue_data, "__wrapped_by_book__"):
            patched = _glue_data_from_the_chapter(module.retrieve_glue_data)
            patched.__wrapped_by_book__ = True
            module.retrieve_glue_data = patched


def _captioned_figure_without_output(directive) -> list:
    """What {glue:figure} builds, less the glued output: the figure node, its label and its caption (and legend)."""
    figure = nodes.figure("")
    directive.set_source_info(figure)
    directive.add_name(figure)
    if directive.content:
        parsed = nodes.Element()
        directive.state.nested_parse(directive.content, directive.content_offset, parsed)
        first = parsed[0]
        if isinstance(first, nodes.paragraph):
            caption = nodes.caption(first.rawsource, "", *first.children)
            caption.source, caption.line = first.source, first.line
            figure += caption
        if len(parsed) > 1:
            figure += nodes.legend("", *parsed[1:])
    return [figure]


def _patch_glue_figure() -> None:
    from myst_nb.ext.glue.directives import PasteFigureDirective

    original = PasteFigureDirective.run
    if getattr(original, "__wrapped_by_book__", False):
        return

    def run(self):
        env = getattr(self.state.document.settings, "env", None)
        if env is not None and env.app.builder.name == "gettext":
            return _captioned_figure_without_output(self)
        return original(self)

    run.__wrapped_by_book__ = True
    PasteFigureDirective.run = run


def _alt_nodes(document):
    for image in document.findall(nodes.image):
        alt = image.get("alt", "")
        if alt and alt.strip():
            yield image, alt


class TranslateAltTexts(SphinxTransform):
    """Replace each figure's alt text by its translation from the chapter's own catalog (after Locale, 21)."""

    default_priority = 21

    def apply(self, **kwargs) -> None:
        catalog = _catalog(self)
        if catalog is None:
            return
        for image, alt in _alt_nodes(self.document):
            translated = catalog.gettext(alt)
            if translated and translated != alt:
                image["alt"] = translated


def _catalog(transform: SphinxTransform):
    """The page's own catalog in a translated build (None in the English build, the gettext build, or none)."""
    config = transform.config
    if not config.language or config.language == "en" or transform.app.builder.name == "gettext":
        return None
    domain = docname_to_domain(transform.env.docname, config.gettext_compact)
    catalog, has_catalog = init_locale([transform.env.srcdir / d for d in config.locale_dirs], config.language, domain)
    return catalog if has_catalog else None


class TranslateToctreeCaptions(SphinxTransform):
    """A part title of _toc.yml, as the root page's catalog translates it (after sphinx-external-toc, 100)."""

    default_priority = 101

    def apply(self, **kwargs) -> None:
        toctrees = [t for t in self.document.findall(addnodes.toctree) if t.get("caption")]
        catalog = _catalog(self) if toctrees else None
        for toctree in toctrees if catalog else []:
            translated = catalog.gettext(toctree["caption"])
            if translated:
                toctree["caption"] = translated


class TranslatePromptTypes(SphinxPostTransform):
    """The English word myst-nb put in a folded cell's prompt, in the build's language (`book_code_prompt_types`)."""

    default_priority = 200  # after myst_nb's HideInputCells (199), which fills {type}
    formats = ("html",)

    def run(self, **kwargs) -> None:
        words = self.config.book_code_prompt_types
        if not words:
            return
        from myst_nb.sphinx_ import HideCodeCellNode

        for node in self.document.findall(HideCodeCellNode):
            for key in ("prompt_show", "prompt_hide"):
                node[key] = re.sub(r"[A-Za-z]+", lambda m: words.get(m.group(), m.group()), node[key])


ALT_OPTION = re.compile(r"^\s*:alt:\s*(.+?)\s*$")


def add_alt_texts_to_catalog(app, doctree, docname: str) -> None:
    """gettext builder only: each alt text becomes a message of the chapter's catalog. They are read from the
    chapter's source (`:alt:` options), because a figure glued from an output has no image node when the
    extraction runs without executing the notebooks."""
    if app.builder.name != "gettext":
        return
    from sphinx.builders.gettext import MsgOrigin

    domain = docname_to_domain(docname, app.builder.config.gettext_compact)
    catalog = app.builder.catalogs[domain]
    source = Path(app.env.doc2path(docname))
    for number, line in enumerate(source.read_text(encoding="utf-8").splitlines(), start=1):
        option = ALT_OPTION.match(line)
        if option:
            catalog.add(option.group(1), MsgOrigin(str(source), number))


def setup(app):
    app.add_config_value("book_code_prompt_types", {}, "html", types=[dict])
    app.add_transform(MarkTableCells)
    app.add_transform(TranslateToctreeCaptions)
    app.add_post_transform(TranslatePromptTypes)
    _patch_glue_lookup()
    _patch_glue_figure()
    app.add_transform(TranslateAltTexts)
    app.connect("doctree-resolved", add_alt_texts_to_catalog)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
