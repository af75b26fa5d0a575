"""JupyterLab, as a person uses it: open a notebook, wait for its kernel, use the menus, read what the page shows.

Every wait is on the page's own state (the kernel's status, the cells' prompts, a dialog), polled by playwright."""

from __future__ import annotations

import re

KERNEL_START_MS = 180_000  # a cold kernel importing torch and transformers on a busy 2-core machine
RUN_ALL_MS = 180_000
NOTEBOOK = ".jp-NotebookPanel:not(.lm-mod-hidden) .jp-Notebook"
# The status bar's kernel item: "Python 3 (ipykernel) | Idle" once a kernel is started and idle ("No Kernel | ..."
# and the toolbar's execution indicator say idle before a kernel is there)
KERNEL_IDLE_JS = """() => [...document.querySelectorAll('.jp-StatusBar-TextItem')]
    .some(item => /^(?!No Kernel).+ \\| Idle$/.test(item.textContent.trim()))"""


def wait_kernel_idle(page, timeout_ms: int) -> None:
    page.wait_for_function(KERNEL_IDLE_JS, timeout=timeout_ms, polling=250)


def open_notebook(page, server, name: str) -> None:
    """The notebook in its own JupyterLab tab, its kernel started and idle."""
    page.goto(server.url(f"lab/tree/{name}"), wait_until="domcontentloaded")
    page.locator(f"{NOTEBOOK} .jp-Cell").first.wait_for(state="visible", timeout=KERNEL_START_MS)
    wait_kernel_idle(page, KERNEL_START_MS)


def menu(page, top: str, item: str) -> None:
    """Click `top` in the menu bar, then `item` in the menu it opens."""
    page.locator(".lm-MenuBar-itemLabel", has_text=re.compile(rf"^{re.escape(top)}$")).click()
    page.locator(".lm-Menu:visible .lm-Menu-itemLabel", has_text=re.compile(rf"^{re.escape(item)}$")).click()


PROMPTS_JS = """() => [...document.querySelectorAll(
    '.jp-NotebookPanel:not(.lm-mod-hidden) .jp-Notebook .jp-CodeCell .jp-InputArea-prompt')]
    .map(prompt => prompt.textContent.trim())"""


def prompts(page) -> list[str]:
    """The input prompt of every code cell, top to bottom: "[3]:" ran, "[*]:" runs or waits, "[ ]:" never ran."""
    return page.evaluate(PROMPTS_JS)


# The notebook toolbar's execution indicator says "busy" while any cell Run All scheduled has not answered yet, and
# the kernel's status once all have. The prompts alone cannot tell: after a cell tagged `raises-exception` fails,
# JupyterLab blanks the prompts of the cells still queued ("[ ]:") although the kernel goes on to run them.
INDICATOR = ".jp-NotebookPanel:not(.lm-mod-hidden) .jp-Notebook-ExecutionIndicator"


def run_all(page) -> list[str]:
    """Run → Run All Cells, then wait until the run is over: the first cell has run, no cell Run All scheduled is
    still waiting for its answer (the execution indicator), no prompt shows `*` and the kernel is idle. Returns the
    prompts."""
    menu(page, "Run", "Run All Cells")
    page.wait_for_function(
        f"""() => {{
            const shown = ({PROMPTS_JS})();
            const indicator = document.querySelector("{INDICATOR}");
            return shown.length > 0 && /\\[\\d+\\]/.test(shown[0]) && !shown.some(text => text.includes('*'))
                && indicator !== null && indicator.getAttribute('data-status') === 'idle';
        }}""",
        timeout=RUN_ALL_MS,
        polling=250,
    )
    wait_kernel_idle(page, RUN_ALL_MS)
    return prompts(page)


def code_cell(page, index: int):
    """The index-th code cell of the open notebook (0 is the first)."""
    return page.locator(f"{NOTEBOOK} .jp-CodeCell").nth(index)


def save(page) -> None:
    """File → Save Notebook, then wait until the notebook's tab no longer shows unsaved changes."""
    menu(page, "File", "Save Notebook")
    page.locator(".lm-TabBar-tab.jp-mod-current.jp-mod-dirty").wait_for(state="detached", timeout=30_000)
