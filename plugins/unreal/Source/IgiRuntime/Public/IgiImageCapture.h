// IgiImageCapture.h - IgiRuntime (Unreal wrapper): what the player sees, as an igi::Image for generate_request
// (protocol 1.1), from a render target or a UTexture2D.
//
//   // "what this scene capture sees", as JPEG (game thread):
//   igi::Image Frame;
//   FString Error;
//   if (UIgiImageCapture::FromRenderTarget(SceneCapture->TextureTarget, EIgiImageEncoding::Jpeg, 75, Frame, Error))
//       Npc->SayWithImage(TEXT("What do you think of this place?"), Frame);
#pragma once

#include "CoreMinimal.h"
#include "Kismet/BlueprintFunctionLibrary.h"

#include "igi/image.hpp"

#include "IgiImageCapture.generated.h"

class UTexture2D;
class UTextureRenderTarget2D;

/** How a capture goes on the wire. */
UENUM(BlueprintType)
enum class EIgiImageEncoding : uint8
{
	Jpeg,  // smallest: a 1280x720 frame is about 100-200 KB at quality 75
	Png,   // lossless, larger
	Rgb8,  // raw pixels, no encode cost (3 bytes per pixel: size the target small)
};

UCLASS()
class IGIRUNTIME_API UIgiImageCapture : public UBlueprintFunctionLibrary
{
	GENERATED_BODY()

public:
	/** Reads a render target (a scene capture's TextureTarget, a minimap) on the game thread. */
	static bool FromRenderTarget(UTextureRenderTarget2D* Target, EIgiImageEncoding Encoding, int32 JpegQuality,
	                             igi::Image& Out, FString& Error);

	/** Reads a UTexture2D whose top mip is uncompressed BGRA8 in CPU memory (CompressionSettings
	 *  VectorDisplacementmap, MipGenSettings NoMipmaps, or a transient texture created at run time). */
	static bool FromTexture2D(UTexture2D* Texture, EIgiImageEncoding Encoding, int32 JpegQuality, igi::Image& Out,
	                          FString& Error);

	/** BGRA8 pixels (top row first) to an Image in the given encoding. */
	static bool FromPixels(const TArray<FColor>& Pixels, int32 Width, int32 Height, EIgiImageEncoding Encoding,
	                       int32 JpegQuality, igi::Image& Out, FString& Error);
};
