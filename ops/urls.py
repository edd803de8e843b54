"""The site's URLconf (ROOT_URLCONF): every app's pages and API, admin, health, metrics and dashboards."""

from django.contrib import admin
from django.urls import include, path

from grading.urls import lab_page_urlpatterns
from labs import urls as labs_urls
from ops.dashboard import ops_dashboard_view
from ops.health import healthz_view, readyz_view
from ops.home import DashboardView
from ops.metrics import metrics_view
from portal.views import CourseAuditPage, TimeZoneView, favicon_view

urlpatterns = [
    path("", DashboardView.as_view(), name="dashboard"),
    path("favicon.ico", favicon_view, name="favicon"),
    path("", include(([*labs_urls.urlpatterns, *lab_page_urlpatterns], "labs"))),
    path("healthz", healthz_view, name="healthz"),
    path("readyz", readyz_view, name="readyz"),
    path("metrics", metrics_view, name="metrics"),
    path("admin/ops/", admin.site.admin_view(ops_dashboard_view), name="ops_dashboard"),
    path("admin/", admin.site.urls),
    path("accounts/time-zone/", TimeZoneView.as_view(), name="time_zone"),
    path("accounts/", include("django.contrib.auth.urls")),
    path("i18n/", include("django.conf.urls.i18n")),
    path("api/", include("api.urls")),
    path("courses/<id:course_id>/audit/", CourseAuditPage.as_view(), name="course-audit"),
    path("grades/", include("grading.urls")),
]

# Failures inside the portal (503 with Retry-After when the database was busy, else 500) and pages not found: JSON
# for the API and the pages' scripts (portal/views.py).
handler500 = "portal.views.server_error"
handler404 = "portal.views.page_not_found"
