# Sphinx configuration of the course site, for both languages (`make book`, course/book.py).
# The sources are staged per language by course/book.py; sphinx-build gets `-D language=en|zh_CN`.
project = "Data-parallel training, from first principles to SWIFT"
author = "the course's authors"
copyright = "the course's authors"
# sphinx-mathjax-offline copies MathJax 3 into each edition's _static/ and points the pages at it: the site
# loads nothing from outside (a CDN is slow or blocked for many of its readers)
extensions = ["myst_nb", "sphinx-mathjax-offline"]
templates_path = ["_templates"]
html_static_path = ["_static"]
html_css_files = ["course.css"]
html_favicon = "_static/favicon.svg"
html_theme = "sphinx_book_theme"
html_title = "Data-parallel training · 数据并行训练"
html_theme_options = {
    "article_header_end": ["language-switch.html", "article-header-buttons.html"],
    "show_navbar_depth": 1,
    "use_download_button": True,
    "home_page_in_toc": True,
}
html_show_sourcelink = False
html_last_updated_fmt = None
nb_execution_mode = "off"  # the notebooks are already executed: their committed outputs are shown
nb_merge_streams = True
# the tables notebooks print (text/markdown outputs) are GitHub-style: CommonMark, the default, has no tables
nb_render_markdown_format = "myst"
myst_enable_extensions = ["dollarmath"]  # MyST reads pipe tables itself
myst_heading_anchors = 3
suppress_warnings = ["myst.header", "mystnb.unknown_mime_type"]
exclude_patterns = ["_build"]

import logging  # noqa: E402

import jieba  # noqa: E402  (Sphinx's Chinese search index splits words with it)

jieba.setLogLevel(logging.WARNING)  # it announces loading its dictionary; imported here first, it stays quiet
