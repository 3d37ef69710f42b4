//! A turn's message as ACP content blocks: the text, then each file that
//! came with it.
//!
//! Images go as `image` blocks (base64) when the agent advertises the
//! `image` prompt capability and the file is at most [`MAX_IMAGE_BYTES`];
//! every other file, and an image the agent cannot take, as a
//! `resource_link` to the saved file (`file://`, which every agent must
//! accept). The text already names each file (`[photo saved at …]`), so
//! an agent that ignores the links still knows where they are.

use std::path::Path;

use agent_client_protocol::v1::schema::{
    ContentBlock, ImageContent, PromptCapabilities, ResourceLink, TextContent,
};
use base64::Engine as _;

use crate::vocab::Attachment;

/// Images larger than this go as a link, not inline.
pub(super) const MAX_IMAGE_BYTES: u64 = 10 * 1024 * 1024;

/// The blocks of a turn with `text` and `attachments`, for an agent that
/// can take what `caps` says.
pub(super) async fn blocks(
    text: &str,
    attachments: &[Attachment],
    caps: &PromptCapabilities,
) -> Vec<ContentBlock> {
    let mut blocks = vec![ContentBlock::Text(TextContent::new(text.to_string()))];
    for file in attachments {
        if file.is_image && caps.image {
            if let Some(image) = inline_image(&file.path, &file.mime).await {
                blocks.push(image);
                continue;
            }
        }
        blocks.push(link(&file.path, &file.mime));
    }
    blocks
}

async fn inline_image(path: &Path, mime: &str) -> Option<ContentBlock> {
    let size = tokio::fs::metadata(path).await.ok()?.len();
    if size > MAX_IMAGE_BYTES {
        return None;
    }
    let bytes = tokio::fs::read(path).await.ok()?;
    let data = base64::engine::general_purpose::STANDARD.encode(bytes);
    Some(ContentBlock::Image(ImageContent::new(
        data,
        mime.to_string(),
    )))
}

fn link(path: &Path, mime: &str) -> ContentBlock {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "file".to_string());
    let uri = url::Url::from_file_path(path)
        .map(String::from)
        .unwrap_or_else(|()| format!("file://{}", path.display()));
    ContentBlock::ResourceLink(ResourceLink::new(name, uri).mime_type(mime.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn images_inline_when_the_agent_takes_them_links_otherwise() {
        let dir = tempfile::tempdir().unwrap();
        let photo = dir.path().join("p.jpg");
        std::fs::write(&photo, b"jpegbytes").unwrap();
        let doc = dir.path().join("a b.pdf");
        std::fs::write(&doc, b"%PDF").unwrap();
        let files = vec![
            Attachment {
                path: photo.clone(),
                mime: "image/jpeg".into(),
                is_image: true,
            },
            Attachment {
                path: doc,
                mime: "application/pdf".into(),
                is_image: false,
            },
        ];
        let with_images = PromptCapabilities::new().image(true);
        let shown = blocks("look", &files, &with_images).await;
        let json = serde_json::to_value(&shown).unwrap();
        assert_eq!(json[0]["text"], "look");
        assert_eq!(json[1]["type"], "image");
        assert_eq!(json[1]["mimeType"], "image/jpeg");
        assert_eq!(json[1]["data"], "anBlZ2J5dGVz");
        assert_eq!(json[2]["type"], "resource_link");
        assert!(json[2]["uri"].as_str().unwrap().ends_with("/a%20b.pdf"));

        let without = blocks("look", &files, &PromptCapabilities::new()).await;
        let json = serde_json::to_value(&without).unwrap();
        assert_eq!(json[1]["type"], "resource_link");
        assert_eq!(json[1]["mimeType"], "image/jpeg");
    }
}
