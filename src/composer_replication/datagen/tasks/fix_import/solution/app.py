from text_utils import slugify


def page_url(title):
    return "/pages/" + slugify(title)
