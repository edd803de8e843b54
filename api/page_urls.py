"""URLs of the HTML pages in ``api.pages``, mounted at the site root."""

from django.urls import path

from api.pages import CourseAuditPage

urlpatterns = [
    path("courses/<id:course_id>/audit/", CourseAuditPage.as_view(), name="course-audit"),
]
