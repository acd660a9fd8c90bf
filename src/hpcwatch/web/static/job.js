// Links to a job's own page (/job/ID, web/jobpage.py): from GPU cards, the queue and the alert strip.

import { h, t } from "./util.js";

/** The address of job `id`'s page (ids such as namespace/pod keep their slash: the route takes a path). */
export function jobHref(id) {
  return `/job/${String(id).split("/").map(encodeURIComponent).join("/")}`;
}

/** A link to job `id`'s page, named for the job so a screen reader says which one it opens. */
export function jobLink(id) {
  return h("a", { class: "job-page-link", href: jobHref(id), "data-job-page": id,
    // The spoken name starts with the visible text (axe: label-content-name-mismatch); the tooltip says it whole.
    "aria-label": `${t("jobpage.open")} ${id}`, title: t("jobpage.open_title", { job: id }) }, t("jobpage.open"));
}
